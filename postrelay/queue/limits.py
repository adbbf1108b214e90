"""Rate and concurrency limits, enforced in the claim across every worker.

A limit applies to one kind, optionally within one tenant (that tenant's jobs of the kind
are then governed by its own limit alone), optionally per value of a payload field
(`key`, e.g. "domain" or "endpoint.id"): each value then has a bucket and a cap of its
own. It caps how many jobs are claimed per second (a token bucket: `rate` per second on
average, up to `burst` at once) and/or how many run at once (`concurrency`). A throttled
job stays pending; no attempt is spent. Workers pick up a change within a second.

    with engine.begin() as conn:
        limit_set(conn, actor="ops:alice", kind="email_send", rate="14/s", concurrency=20)
        limit_set(conn, actor="ops:alice", kind="outbox_dispatch", rate="5/s",
                  key="endpoint_id")
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from sqlalchemy import Connection

from postrelay.core.errors import ForbiddenError, NotFoundError, ValidationError
from postrelay.core.rates import parse_rate
from postrelay.core.sqlfiles import load_queries
from postrelay.core.telemetry import event
from postrelay.queue.admin import (
    ADMIN_SQL,
    TENANT_KEY_ACTOR,
    _actor,
    _check_kind,
    _uuid_or_none,
    made_by_tenant_key,
)

LIMITS_SQL = load_queries("postrelay.queue", "sql/limits.sql")
_KEY_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,62}$")
MAX_CAP = 1_000_000


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit; `key_path` is the payload path split on dots (None: one bucket)."""

    kind: str
    tenant_id: UUID | None
    key_path: list[str] | None
    rate_per_sec: float | None
    burst: int | None
    concurrency: int | None
    created_by: str
    created_at: datetime

    @property
    def key(self) -> str | None:
        return ".".join(self.key_path) if self.key_path else None

    def describe(self) -> str:
        parts = []
        if self.rate_per_sec is not None:
            parts.append(f"{self.rate_per_sec:g}/s (burst {self.burst})")
        if self.concurrency is not None:
            parts.append(f"at most {self.concurrency} running")
        scope = f"kind {self.kind}" + (f", tenant {self.tenant_id}" if self.tenant_id else "")
        per = f", per {self.key}" if self.key else ""
        return f"{scope}{per}: {', '.join(parts)}"


def limit_set(
    conn: Connection, *, actor: str, kind: str, tenant_id: UUID | str | None = None,
    rate: str | float | None = None, burst: int | None = None,
    concurrency: int | None = None, key: str | None = None,
) -> Limit:
    """Set (or replace) the limit of `kind`, optionally within `tenant_id`: a `rate`
    (`14/s`, `1000/min`) with a `burst` (default: one second's worth, at least 1), and/or
    a `concurrency` cap; optionally per value of the payload field `key` (dots for nested
    fields). A kind-wide limit removes the limits tenant keys had set on the kind within
    their tenants (each a `limit_removed` audit row by `actor`, reason `kind_wide_limit`):
    none may take its tenant's jobs out of it. Bad input is a ValidationError naming the
    field; nothing is written. A tenant key (by its actor) changes no limit the operator
    set and sets none on a kind limited for every tenant (ForbiddenError `operator_limit`,
    `kind_wide_limit`), judged as it writes."""
    if not isinstance(kind, str) or not kind:
        raise ValidationError("kind", "is required")
    _check_kind(conn, kind)
    tenant = _uuid_or_none("tenant_id", tenant_id)
    if tenant is not None and not conn.execute(ADMIN_SQL["tenant_exists"], {"id": tenant}).scalar():
        raise ValidationError("tenant_id", f"unknown tenant {tenant}")
    if rate is None and concurrency is None:
        raise ValidationError("rate", "give a rate, a concurrency, or both")
    per_sec = None if rate is None else parse_rate(rate)
    if burst is not None and rate is None:
        raise ValidationError("burst", "applies to a rate: give one")
    if per_sec is not None:
        burst = max(1, math.ceil(per_sec)) if burst is None else _count("burst", burst)
    cap = None if concurrency is None else _count("concurrency", concurrency)
    tenant_key = made_by_tenant_key(_actor(actor))
    if tenant is None or tenant_key:
        conn.execute(LIMITS_SQL["job_limit_kind_lock"], {"kind": kind})
    row = conn.execute(LIMITS_SQL["job_limit_upsert"], {
        "kind": kind, "tenant_id": tenant, "key_path": _key_path(key),
        "rate_per_sec": per_sec, "burst": burst, "concurrency": cap, "actor": actor,
        "tenant_key_actor": TENANT_KEY_ACTOR, "tenant_key_only": tenant_key,
    }).first()
    if row is None:
        raise _not_a_tenant_keys(conn, kind, tenant)
    fields = dict(row._mapping)
    displaced = fields.pop("displaced")
    found = Limit(**fields)
    event("postrelay.queue.job_limit_set", limit=found.describe(), actor=actor,
          **({"removed_tenant_key_limits": displaced} if displaced else {}))
    return found


def limit_ensure_rate(conn: Connection, *, actor: str, kind: str, rate: str) -> bool:
    """Make the kind-wide limit of `kind` have this rate (burst: one second's worth),
    keeping its concurrency cap and key; returns whether anything changed (an unchanged
    limit writes nothing, not even an audit row). For a setting that owns the rate, such
    as POSTRELAY_SMTP_RATE, applied as each worker starts."""
    per_sec = parse_rate(rate)
    current = next((lim for lim in limit_list(conn) if lim.kind == kind
                    and lim.tenant_id is None), None)
    burst = max(1, math.ceil(per_sec))
    if current is not None and current.rate_per_sec == per_sec and current.burst == burst:
        return False
    limit_set(conn, actor=actor, kind=kind, rate=per_sec, burst=burst,
              concurrency=current.concurrency if current else None,
              key=current.key if current else None)
    return True


def limit_remove(conn: Connection, *, actor: str, kind: str,
                 tenant_id: UUID | str | None = None) -> Limit:
    """Remove the limit of exactly this scope. NotFoundError when there is none."""
    if not isinstance(kind, str) or not kind:
        raise ValidationError("kind", "is required")
    _check_kind(conn, kind)
    tenant = _uuid_or_none("tenant_id", tenant_id)
    tenant_key = made_by_tenant_key(_actor(actor))
    row = conn.execute(LIMITS_SQL["job_limit_delete"], {
        "kind": kind, "tenant_id": tenant, "actor": actor,
        "tenant_key_actor": TENANT_KEY_ACTOR, "tenant_key_only": tenant_key,
    }).first()
    if row is None and tenant_key and any(lim.kind == kind and lim.tenant_id == tenant
                                          for lim in limit_list(conn, tenant_id=tenant)):
        raise _not_a_tenant_keys(conn, kind, tenant)
    if row is None:
        raise NotFoundError(f"no limit for kind {kind}"
                            + (f", tenant {tenant}" if tenant else ""))
    found = Limit(**row._mapping)
    event("postrelay.queue.job_limit_remove", limit=found.describe(), actor=actor)
    return found


def limit_list(conn: Connection, *, tenant_id: UUID | str | None = None) -> list[Limit]:
    """Every limit; with `tenant_id`, those that govern that tenant's jobs."""
    params = {"tenant_id": _uuid_or_none("tenant_id", tenant_id)}
    return [Limit(**row._mapping) for row in conn.execute(LIMITS_SQL["job_limit_list"], params)]


def _not_a_tenant_keys(conn: Connection, kind: str, tenant: UUID | None) -> ForbiddenError:
    """Why a tenant key's write of `kind`'s limit in `tenant` found nothing it may change
    (the rule of access.check_limit_change, which the API asks first)."""
    for found in limit_list(conn, tenant_id=tenant):
        if found.kind == kind and found.tenant_id is not None \
                and not made_by_tenant_key(found.created_by):
            return ForbiddenError("operator_limit", f"{found.describe()} was set by "
                                  f"{found.created_by}; only the operator changes it")
    return ForbiddenError("kind_wide_limit", f"kind {kind} has a limit for every tenant; a "
                          "limit of this tenant's own would take its jobs out of it, so "
                          "only the operator sets one")


def _count(field: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CAP:
        raise ValidationError(field, f"must be a whole number from 1 to {MAX_CAP:,}")
    return value


def _key_path(key: str | None) -> list[str] | None:
    """A payload field, dots between nested names: each part a plain name."""
    if key is None:
        return None
    parts = key.split(".") if isinstance(key, str) else []
    if not parts or len(parts) > 8 or not all(_KEY_PART.fullmatch(p) for p in parts):
        raise ValidationError(
            "key", "must be a payload field name (letters, digits, _ and -), with dots "
                   "between nested names, such as domain or recipient.domain")
    return parts
