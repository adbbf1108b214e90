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

from postrelay.core.errors import ConflictError, ForbiddenError, NotFoundError, ValidationError
from postrelay.core.sqlfiles import load_queries
from postrelay.core.telemetry import event
from postrelay.queue.admin import (
    ADMIN_SQL,
    TENANT_KEY_ACTOR,
    _actor,
    _check_kind,
    _uuid_or_none,
    _wake_workers,
    made_by_tenant_key,
)

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
    given to pause every job, so that a forgotten option never stops the installation.
    An operator (any actor but a tenant key's, `api:key:…`, `dashboard:key:…`) pausing a
    scope a tenant key paused takes the pause over, so that the key cannot lift it."""
    tenant = _scope(conn, kind=kind, tenant_id=tenant_id, everything=everything)
    params = {"tenant_id": tenant, "kind": kind, "actor": _actor(actor),
              "tenant_key_actor": TENANT_KEY_ACTOR}
    # Each statement sees what committed before it: a pause lifted between the insert
    # finding it and the read below is paused afresh by the next round.
    for _ in range(3):
        row = conn.execute(PAUSES_SQL["job_pause_insert"], params).first()
        if row is not None:
            found = Pause(**row._mapping)
            event("postrelay.queue.job_pause", scope=found.describe(), actor=actor)
            return found, True
        if not made_by_tenant_key(actor):
            row = conn.execute(PAUSES_SQL["job_pause_take_over"], params).first()
            if row is not None:
                found = Pause(**row._mapping)
                event("postrelay.queue.job_pause_taken_over", scope=found.describe(),
                      actor=actor)
                return found, False
        row = conn.execute(PAUSES_SQL["job_pause_get"], params).first()
        if row is not None:
            return Pause(**row._mapping), False
    raise ConflictError("the pause was lifted and made again while pausing; try again")


def resume(
    conn: Connection, *, actor: str, kind: str | None = None,
    tenant_id: UUID | str | None = None, everything: bool = False,
) -> Pause:
    """Lift the pause of exactly this scope (narrower pauses inside it stay) and wake idle
    workers. NotFoundError when the scope is not paused. A tenant key (by its actor) lifts
    only what tenant keys paused: ForbiddenError `operator_pause` for the operator's."""
    tenant = _scope(conn, kind=kind, tenant_id=tenant_id, everything=everything)
    tenant_key = made_by_tenant_key(_actor(actor))
    params = {"tenant_id": tenant, "kind": kind, "actor": actor,
              "tenant_key_only": tenant_key, "tenant_key_actor": TENANT_KEY_ACTOR}
    row = conn.execute(PAUSES_SQL["job_pause_delete"], params).first()
    if row is None and tenant_key:
        held = conn.execute(PAUSES_SQL["job_pause_get"], params).first()
        if held is not None:  # the operator's, as the delete judged it
            raise ForbiddenError("operator_pause", f"{Pause(**held._mapping).describe()} "
                                 f"was paused by {held.paused_by}; only the operator "
                                 "resumes it")
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
