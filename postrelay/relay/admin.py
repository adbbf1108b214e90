"""Operator views of the outbox (CLI now, HTTP API later)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from postrelay.core.errors import NotFoundError, ValidationError
from postrelay.relay.queries import OUTBOX_SQL


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
    params = {"tenant_id": _uuid("tenant_id", tenant_id) if tenant_id else None}
    backlog, lag, dead, handled, retrying = conn.execute(OUTBOX_SQL["outbox_status"], params).one()
    dead_rows = conn.execute(OUTBOX_SQL["outbox_dead_list"],
                             {**params, "limit": dead_limit}).mappings()
    return OutboxStatus(backlog, lag, dead, handled, retrying, [dict(r) for r in dead_rows])


@dataclass(frozen=True, slots=True)
class OutboxEventView:
    """One outbox event as an operator sees it, with every job the relay made of it."""

    id: UUID
    tenant_id: UUID
    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: dict[str, Any]
    headers: dict[str, Any]
    created_at: datetime
    created_by: str | None
    seq: int
    handled_at: datetime | None
    jobs_created: int | None
    attempts: int
    available_at: datetime
    last_error: str | None
    dead_at: datetime | None
    jobs: list[dict[str, Any]]  # route, job_id, kind, status, attempts (kind/status None: pruned)

    @property
    def status(self) -> str:
        """handled, dead, retrying (routing failed, will be tried again) or pending."""
        if self.handled_at is not None:
            return "handled"
        if self.dead_at is not None:
            return "dead"
        return "retrying" if self.attempts > 0 else "pending"


def outbox_event_get(
    conn: Connection, event_id: UUID | str, *, tenant_id: UUID | str | None = None
) -> OutboxEventView | None:
    """The event with this id and its jobs, or None (also when it is another tenant's)."""
    event = _uuid("event_id", event_id)
    row = conn.execute(OUTBOX_SQL["outbox_event_get"], {
        "event_id": event, "tenant_id": _uuid("tenant_id", tenant_id) if tenant_id else None,
    }).mappings().first()
    if row is None:
        return None
    jobs = conn.execute(OUTBOX_SQL["outbox_jobs_of_event"], {
        "event_id": event, "tenant_id": row["tenant_id"]}).mappings()
    return OutboxEventView(**row, jobs=[dict(j) for j in jobs])


def outbox_replay(
    conn: Connection,
    *,
    event_id: UUID | str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    tenant_id: UUID | str | None = None,
    dead: bool = False,
) -> int:
    """Hand one event, or every event created in [since, until), back to the relay; returns
    how many. `dead`: only the events the relay gave up on (alone: all of them). Jobs that
    still exist are not created again (their delivery links), but for webhook deliveries
    that stopped unsent (`failed`: the endpoint was disabled or gone).

        outbox_replay(conn, dead=True, since=incident_start, tenant_id=acme)
    """
    rows = conn.execute(OUTBOX_SQL["outbox_replay"],
                        _replay_filter(event_id, since, until, tenant_id, dead)).all()
    if event_id is not None and not rows:
        raise NotFoundError(f"no outbox event {event_id}")
    return len(rows)


def outbox_replay_count(
    conn: Connection,
    *,
    event_id: UUID | str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    tenant_id: UUID | str | None = None,
    dead: bool = False,
) -> int:
    """How many events `outbox_replay` with the same arguments would hand back now."""
    count: int = conn.execute(OUTBOX_SQL["outbox_replay_count"],
                              _replay_filter(event_id, since, until, tenant_id, dead)
                              ).scalar_one()
    return count


def _replay_filter(event_id: UUID | str | None, since: datetime | None,
                   until: datetime | None, tenant_id: UUID | str | None,
                   dead: bool) -> dict[str, Any]:
    if not isinstance(dead, bool):
        raise ValidationError("dead", f"must be True or False, got {dead!r}")
    if event_id is None and since is None and until is None and not dead:
        raise ValidationError("event_id", "give an event id, a time range (since/until), or "
                                          "dead (the events the relay gave up on)")
    if event_id is not None and (since is not None or until is not None):
        raise ValidationError("event_id", "give an event id or a time range, not both")
    if event_id is not None and dead:
        # One named event is replayed whatever its state; `dead` picks among many.
        raise ValidationError("dead", "selects among events, not one event id: give dead "
                                      "without an event id")
    # An empty range would replay nothing and say so as if that were the answer.
    if since is not None and until is not None and since >= until:
        raise ValidationError("until", "must be after since")
    return {
        "event_id": _uuid("event_id", event_id) if event_id else None,
        "since": since, "until": until,
        "tenant_id": _uuid("tenant_id", tenant_id) if tenant_id else None,
        "dead": dead,
    }


def _uuid(name: str, value: UUID | str) -> UUID:
    try:
        return value if isinstance(value, UUID) else UUID(str(value))
    except ValueError:
        raise ValidationError(name, f"must be a UUID, got {value!r}") from None
