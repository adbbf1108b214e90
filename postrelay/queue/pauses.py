"""Pausing and resuming: workers claim no job of a paused scope until it is resumed.

A scope is every job, one kind, one tenant, or one kind within one tenant. Paused jobs stay
`pending` with their attempts; running ones finish. The claim itself reads the pauses
(sql/claim.sql, job_claim), so every worker honours a pause from its next claim on, behind a
transaction pooler too. Plain functions on the caller's sync Connection; they never commit.

    with engine.begin() as conn:
        pause(conn, actor="ops:alice", kind="email_send")
        ...
        resume(conn, actor="ops:alice", kind="email_send")
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from sqlalchemy import Connection

from postrelay.core.errors import NotFoundError, ValidationError
from postrelay.core.sqlfiles import load_queries
from postrelay.core.telemetry import event
from postrelay.queue.admin import ADMIN_SQL, _actor, _check_kind, _uuid_or_none, _wake_workers

PAUSES_SQL = load_queries("postrelay.queue", "sql/pauses.sql")


@dataclass(frozen=True, slots=True)
class Pause:
    """One paused scope; None stands for every tenant or every kind."""

    tenant_id: UUID | None
    kind: str | None
    paused_by: str
    paused_at: datetime

    def describe(self) -> str:
        kinds = f"kind {self.kind}" if self.kind else "every kind"
        tenants = f"tenant {self.tenant_id}" if self.tenant_id else "every tenant"
        return f"{kinds}, {tenants}"


def pause(
    conn: Connection, *, actor: str, kind: str | None = None,
    tenant_id: UUID | str | None = None, everything: bool = False,
) -> tuple[Pause, bool]:
    """Pause a scope; returns the pause and whether this call made it (False: it was
    paused already, by the actor and since the time the pause names). `everything` must be
    given to pause every job, so that a forgotten option never stops the installation."""
    tenant = _scope(conn, kind=kind, tenant_id=tenant_id, everything=everything)
    params = {"tenant_id": tenant, "kind": kind, "actor": _actor(actor)}
    row = conn.execute(PAUSES_SQL["job_pause_insert"], params).first()
    created = row is not None
    if row is None:
        row = conn.execute(PAUSES_SQL["job_pause_get"], params).one()
    found = Pause(**row._mapping)
    if created:
        event("postrelay.queue.job_pause", scope=found.describe(), actor=actor)
    return found, created


def resume(
    conn: Connection, *, actor: str, kind: str | None = None,
    tenant_id: UUID | str | None = None, everything: bool = False,
) -> Pause:
    """Lift the pause of exactly this scope (narrower pauses inside it stay) and wake idle
    workers. NotFoundError when the scope is not paused."""
    tenant = _scope(conn, kind=kind, tenant_id=tenant_id, everything=everything)
    params = {"tenant_id": tenant, "kind": kind, "actor": _actor(actor)}
    row = conn.execute(PAUSES_SQL["job_pause_delete"], params).first()
    if row is None:
        shown = Pause(tenant, kind, "", datetime.min).describe()
        raise NotFoundError(f"not paused: {shown}")
    _wake_workers(conn)  # their jobs are due, and idle workers sleep until told
    found = Pause(**row._mapping)
    event("postrelay.queue.job_resume", scope=found.describe(), actor=actor)
    return found


def pause_list(conn: Connection, *, tenant_id: UUID | str | None = None) -> list[Pause]:
    """Every pause, oldest first; with `tenant_id`, those that hold that tenant's jobs:
    its own and the installation-wide ones."""
    params = {"tenant_id": _uuid_or_none("tenant_id", tenant_id)}
    return [Pause(**row._mapping) for row in conn.execute(PAUSES_SQL["job_pause_list"], params)]


def _scope(
    conn: Connection, *, kind: str | None, tenant_id: UUID | str | None, everything: bool
) -> UUID | None:
    """The scope's tenant, after checking the kind and the tenant exist."""
    tenant = _uuid_or_none("tenant_id", tenant_id)
    if everything and (kind is not None or tenant is not None):
        raise ValidationError("all", "pauses every job: give it without kind and tenant_id")
    if not everything and kind is None and tenant is None:
        raise ValidationError(
            "scope", "give a kind, a tenant_id, or both; or `all` for every job")
    if kind is not None:
        if not isinstance(kind, str):
            raise ValidationError("kind", "must be a string")
        _check_kind(conn, kind)
    if tenant is not None and not conn.execute(ADMIN_SQL["tenant_exists"], {"id": tenant}).scalar():
        raise ValidationError("tenant_id", f"unknown tenant {tenant}")
    return tenant
