"""Operator views of the outbox (CLI now, HTTP API later)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from postrelay.relay.emit import Q


@dataclass(frozen=True, slots=True)
class OutboxStatus:
    backlog: int
    lag_secs: float | None  # age of the oldest unhandled event
    dead: int
    handled: int
    retrying: int
    dead_events: list[dict[str, Any]] = field(default_factory=list)


def outbox_status(
    conn: Connection, *, tenant_id: UUID | str | None = None, dead_limit: int = 20
) -> OutboxStatus:
    params = {"tenant_id": str(tenant_id) if tenant_id else None}
    backlog, lag, dead, handled, retrying = conn.execute(Q["outbox_status"], params).one()
    dead_rows = conn.execute(Q["outbox_dead_list"], {**params, "limit": dead_limit}).mappings()
    return OutboxStatus(backlog, lag, dead, handled, retrying, [dict(r) for r in dead_rows])
