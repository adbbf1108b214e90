"""Operator operations on the queue: status, reading jobs, and the dead-letter queue.

Plain functions on the caller's sync SQLAlchemy Connection; they never commit. The CLI
and the HTTP API call them. `tenant_id` scopes any of them to one tenant's jobs: another
tenant's job behaves exactly as a missing one.

    with engine.begin() as conn:
        for job in dlq_list(conn, limit=10):
            dlq_retry(conn, job.id, actor="ops:alice")

Every mutation writes its `aa_job_audit` rows in the same statement (see sql/admin.sql).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Row

from postrelay.core.dbcall import execution_option
from postrelay.core.errors import ConflictError, NotFoundError, ValidationError
from postrelay.core.limits import checked_text
from postrelay.core.sqlfiles import load_queries
from postrelay.core.telemetry import event
from postrelay.queue.queries import JOB_SQL
from postrelay.queue.schema import STATUSES

ADMIN_SQL = load_queries("postrelay.queue", "sql/admin.sql")

LIST_LIMIT_MAX = 500
REQUEUE_LIMIT_MAX = 1000
CANCEL_LIMIT_MAX = 1000


@dataclass(frozen=True, slots=True)
class JobView:
    """One `aa_job` row as an operator sees it (kind and status as plain strings)."""

    id: UUID
    tenant_id: UUID
    kind: str
    status: str
    payload: dict[str, Any]
    priority: int
    available_at: datetime
    attempts: int
    max_attempts: int
    last_error: str | None
    claimed_by: str | None
    claimed_at: datetime | None
    completed_at: datetime | None
    idempotency_key: str | None
    created_at: datetime
    created_by: str | None


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """Job counts right now. Every status appears in `by_status`, zeros included; the
    breakdowns by kind and by tenant list only the combinations that have jobs."""

    by_status: Mapping[str, int]
    by_kind: Mapping[str, Mapping[str, int]]
    by_tenant: Mapping[UUID, Mapping[str, int]]
    due_pending: int  # pending and available_at <= now(): waiting only for a worker
    oldest_due_age_secs: float | None  # how long the oldest due job has waited; None if none


@dataclass(frozen=True, slots=True)
class TenantView:
    id: UUID
    name: str
    created_at: datetime


def queue_status(conn: Connection, *, tenant_id: UUID | str | None = None) -> QueueStatus:
    """Counts by status, by (kind, status) and by (tenant, status), plus the due backlog."""
    params = {"tenant_id": _uuid_or_none("tenant_id", tenant_id)}
    by_status = dict.fromkeys(STATUSES, 0)
    by_kind: dict[str, dict[str, int]] = {}
    by_tenant: dict[UUID, dict[str, int]] = {}
    for row in conn.execute(ADMIN_SQL["job_status_counts"], params):
        by_status[row.status] += row.n
        kind = by_kind.setdefault(row.kind, {})
        kind[row.status] = kind.get(row.status, 0) + row.n
        tenant = by_tenant.setdefault(row.tenant_id, {})
        tenant[row.status] = tenant.get(row.status, 0) + row.n
    due = conn.execute(ADMIN_SQL["job_pending_due"], params).one()
    return QueueStatus(by_status, by_kind, by_tenant, due.due, due.oldest_age_secs)


def job_get(
    conn: Connection, job_id: UUID | str, *, tenant_id: UUID | str | None = None
) -> JobView | None:
    """The job with this id, or None (also when it belongs to another tenant)."""
    row = conn.execute(
        ADMIN_SQL["job_get"],
        {"id": _uuid("job_id", job_id), "tenant_id": _uuid_or_none("tenant_id", tenant_id)},
    ).first()
    return _view(row) if row is not None else None


def job_list(
    conn: Connection,
    *,
    status: str | None = None,
    kind: str | None = None,
    tenant_id: UUID | str | None = None,
    limit: int = 50,
) -> list[JobView]:
    """Jobs matching every filter given, newest first; `limit` between 1 and 500."""
    if status is not None and status not in STATUSES:
        raise ValidationError("status", f"must be one of {', '.join(STATUSES)}")
    if kind is not None:
        _check_kind(conn, kind)
    params = {
        "status": status,
        "kind": kind,
        "tenant_id": _uuid_or_none("tenant_id", tenant_id),
        "limit": _limit(limit, LIST_LIMIT_MAX),
    }
    return [_view(row) for row in conn.execute(ADMIN_SQL["job_list"], params)]


def dlq_list(
    conn: Connection, *, tenant_id: UUID | str | None = None, limit: int = 50
) -> list[JobView]:
    """Dead jobs, the most recently dead-lettered first; `limit` between 1 and 500."""
    params = {
        "tenant_id": _uuid_or_none("tenant_id", tenant_id),
        "limit": _limit(limit, LIST_LIMIT_MAX),
    }
    return [_view(row) for row in conn.execute(ADMIN_SQL["dlq_list"], params)]


def dlq_retry(
    conn: Connection, job_id: UUID | str, *, actor: str, tenant_id: UUID | str | None = None
) -> JobView:
    """Send one dead job back to `pending`, due now, with its attempts kept: it gets
    exactly one more try and returns to the DLQ if that fails. Raises NotFoundError when
    the job is not in the DLQ (or belongs to another tenant)."""
    job = _uuid("job_id", job_id)
    row = conn.execute(
        ADMIN_SQL["dlq_retry"],
        {"id": job, "tenant_id": _uuid_or_none("tenant_id", tenant_id), "actor": _actor(actor)},
    ).first()
    if row is None:
        raise NotFoundError(f"job {job} is not in the DLQ")
    _wake_workers(conn)
    event("postrelay.queue.dlq_retry", job_id=str(job), actor=actor)
    return _view(row)


def dlq_requeue(
    conn: Connection,
    *,
    actor: str,
    tenant_id: UUID | str | None = None,
    limit: int = REQUEUE_LIMIT_MAX,
) -> int:
    """Send up to `limit` (1..1000) dead jobs back to `pending`, oldest first, attempts
    kept; returns how many. Call again while it returns `limit` to drain a larger DLQ."""
    params = {
        "tenant_id": _uuid_or_none("tenant_id", tenant_id),
        "limit": _limit(limit, REQUEUE_LIMIT_MAX),
        "actor": _actor(actor),
    }
    count = int(conn.execute(ADMIN_SQL["dlq_requeue"], params).scalar_one())
    if count:
        _wake_workers(conn)
    event("postrelay.queue.dlq_requeue", requeued=count, actor=actor)
    return count


def dlq_discard(
    conn: Connection, job_id: UUID | str, *, actor: str, tenant_id: UUID | str | None = None
) -> None:
    """Delete one dead job, keeping a copy of the whole row in its `job_discard` audit
    row. Raises NotFoundError when the job is not in the DLQ (or belongs to another tenant)."""
    job = _uuid("job_id", job_id)
    row = conn.execute(
        ADMIN_SQL["dlq_discard"],
        {"id": job, "tenant_id": _uuid_or_none("tenant_id", tenant_id), "actor": _actor(actor)},
    ).first()
    if row is None:
        raise NotFoundError(f"job {job} is not in the DLQ")
    event("postrelay.queue.dlq_discard", job_id=str(job), actor=actor)


@dataclass(frozen=True, slots=True)
class Cancelled:
    """A job that a cancel has just failed; `was` is `pending` or `running`."""

    id: UUID
    kind: str
    was: str


def job_cancel(
    conn: Connection, job_id: UUID | str, *, actor: str, tenant_id: UUID | str | None = None
) -> Cancelled:
    """Cancel one pending, scheduled or running job: it becomes `failed` now, with
    last_error naming `actor` and the time, and a `job_cancelled` audit row; a running job's
    worker cancels its handler within a second. Raises NotFoundError for an unknown job (or
    another tenant's), ConflictError for one that already finished."""
    job = _uuid("job_id", job_id)
    tenant = _uuid_or_none("tenant_id", tenant_id)
    rows = _cancel(conn, actor=actor, id=job, tenant_id=tenant, limit=1)
    if rows:
        return rows[0]
    state = conn.execute(ADMIN_SQL["job_cancel_state"], {"id": job, "tenant_id": tenant}).first()
    if state is None:
        raise NotFoundError(f"job {job} not found")
    # `running` here means a worker is writing its outcome this instant (SKIP LOCKED).
    raise ConflictError(f"job {job} is {state.status}: only a pending or running job "
                        "can be cancelled")


def jobs_cancel(
    conn: Connection,
    *,
    actor: str,
    tenant_id: UUID | str | None = None,
    kind: str | None = None,
    created_from: datetime | None = None,
    created_to: datetime | None = None,
    event_id: UUID | str | None = None,
    template: str | None = None,
    limit: int = CANCEL_LIMIT_MAX,
) -> list[Cancelled]:
    """Cancel up to `limit` (1..1000) pending or running jobs matching every filter given,
    oldest first, as job_cancel does one. At least one filter is required. `event_id`:
    jobs made from that outbox event; `template`: email_send jobs of that template. Call
    again while it returns `limit` jobs to cancel more."""
    tenant = _uuid_or_none("tenant_id", tenant_id)
    event = _uuid_or_none("event_id", event_id)
    if kind is not None:
        _check_kind(conn, kind)
    if tenant is not None and not conn.execute(ADMIN_SQL["tenant_exists"], {"id": tenant}).scalar():
        raise ValidationError("tenant_id", f"unknown tenant {tenant}")
    for name, value in (("created_from", created_from), ("created_to", created_to)):
        if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
            raise ValidationError(name, "must be a timestamp with a time zone")
    if created_from is not None and created_to is not None and created_from >= created_to:
        raise ValidationError("created_to", "must be later than created_from")
    if template is not None and (not isinstance(template, str) or not template.strip()):
        raise ValidationError("template", "must be a non-empty string")
    if template is not None:  # a NUL or a lone surrogate would fail in the driver
        checked_text(template, "template")
    if all(v is None for v in (tenant, kind, created_from, created_to, event, template)):
        raise ValidationError(
            "filter", "give at least one of kind, tenant_id, created_from, created_to, "
                      "event_id, template")
    return _cancel(conn, actor=actor, tenant_id=tenant, kinds=[kind] if kind else None,
                   created_from=created_from, created_to=created_to, event_id=event,
                   template=template, limit=_limit(limit, CANCEL_LIMIT_MAX))


def _cancel(conn: Connection, *, actor: str, limit: int, **filters: Any) -> list[Cancelled]:
    params = {"id": None, "tenant_id": None, "kinds": None, "created_from": None,
              "created_to": None, "event_id": None, "template": None, **filters,
              "actor": _actor(actor), "limit": limit}
    rows = [Cancelled(r.id, r.kind, r.was) for r in conn.execute(ADMIN_SQL["job_cancel"], params)]
    event("postrelay.queue.job_cancel", cancelled=len(rows),
          running=sum(r.was == "running" for r in rows), actor=actor)
    return rows


def tenant_list(conn: Connection) -> list[TenantView]:
    """Every tenant, by name."""
    return [TenantView(**row._mapping) for row in conn.execute(ADMIN_SQL["tenant_list"])]


def _view(row: Row[Any]) -> JobView:
    return JobView(**row._mapping)


def _wake_workers(conn: Connection) -> None:
    # Idle workers sleep until the next due job or a NOTIFY; the jobs are due now.
    if execution_option(conn, "postrelay_notify", True):
        conn.execute(JOB_SQL["job_notify"])


def _check_kind(conn: Connection, kind: str) -> None:
    kinds = conn.execute(JOB_SQL["job_kinds"]).scalars().all()
    if kind not in kinds:
        raise ValidationError("kind", f"unknown job kind {kind!r}; known: {', '.join(kinds)}")


def _limit(limit: int, maximum: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= maximum:
        raise ValidationError("limit", f"must be between 1 and {maximum}")
    return limit


# The actors of tenant keys, as the API and the dashboard write them into audit rows
# (`api:key:<name>`, `dashboard:key:<name>`); any other actor is the operator. A pattern
# that PostgreSQL's `~` reads as Python's re.match does.
TENANT_KEY_ACTOR = "^(api|dashboard):key:"


def made_by_tenant_key(actor: str) -> bool:
    return re.match(TENANT_KEY_ACTOR, actor) is not None


def _actor(actor: str) -> str:
    if not isinstance(actor, str) or not actor.strip():
        raise ValidationError("actor", "must be a non-empty string")
    return actor


def _uuid(field: str, value: UUID | str) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        raise ValidationError(field, f"must be a UUID, got {value!r}") from None


def _uuid_or_none(field: str, value: UUID | str | None) -> UUID | None:
    return None if value is None else _uuid(field, value)
