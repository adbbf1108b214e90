"""Operator views of the outbox (CLI now, HTTP API later)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from postrelay.core.errors import NotFoundError, ValidationError
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


def outbox_replay(
    conn: Connection,
    *,
    event_id: UUID | str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    tenant_id: UUID | str | None = None,
) -> int:
    """Hand one event, or every event created in [since, until), back to the relay; returns
    how many. Jobs that still exist are not created again (their idempotency keys)."""
    if event_id is None and since is None and until is None:
        raise ValidationError("event_id", "give an event id or a time range (since/until)")
    rows = conn.execute(Q["outbox_replay"], {
        "event_id": str(event_id) if event_id else None, "since": since, "until": until,
        "tenant_id": str(tenant_id) if tenant_id else None,
    }).all()
    if event_id is not None and not rows:
        raise NotFoundError(f"no outbox event {event_id}")
    return len(rows)
