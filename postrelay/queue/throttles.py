"""Adaptive back-off shared by every worker: a destination that refuses work is slowed
down for all of them at once, in the claim, and recovers step by step.

A destination is a kind as a whole (the SMTP server of `email_send`) or one value of a
payload field (a webhook endpoint of `outbox_dispatch`, by `endpoint_id`). When it refuses
(SMTP 421/454, HTTP 429/503) the handler that got the refusal calls `throttle_refused`; the
job itself is retried as it would be anyway. From then on the limited claim
(sql/limited.sql, job_claim_limited) takes none of the destination's jobs for the pause (the
receiver's Retry-After, or the sender's own wait; at least a second), then claims them at
half the configured rate (the floor when none is configured), doubling every
`step_secs` until the configured rate is reached (none configured: until `free_per_sec`),
where the throttle ends. A refusal of a destination that was sending again halves the rate
it had reached; refusals during the pause only count. Every worker reads the state with
its next claim (a throttled kind is claimed by job_claim_limited within a second), and
the maintenance leader deletes throttles whose time is up (`throttle_end`). Starting and
ending leave rows in aa_flow_audit and telemetry events.

    policy = ThrottlePolicy(step_secs=10.0)
    await throttle_refused(engine, policy, kind="outbox_dispatch", key_path=["endpoint_id"],
                           key=str(endpoint_id), tenant_id=tenant, pause_secs=2.0,
                           reason="HTTP 429 Retry-After 2", actor="webhook endpoint ...")
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from postrelay.core.sqlfiles import load_queries
from postrelay.core.telemetry import event
from postrelay.queue.admin import _uuid_or_none

THROTTLES_SQL = load_queries("postrelay.queue", "sql/throttles.sql")
MAINTENANCE_ACTOR = "maintenance"


@dataclass(frozen=True, slots=True)
class ThrottlePolicy:
    """How a refused destination recovers: paused at least `min_pause_secs`, then from half
    the configured rate (at least `floor_per_sec`) doubling every `step_secs` up to it; with
    no configured rate, from `floor_per_sec` up to `free_per_sec`, where it is unlimited
    again."""

    step_secs: float = 10.0
    floor_per_sec: float = 1.0
    free_per_sec: float = 64.0
    min_pause_secs: float = 1.0

    def __post_init__(self) -> None:
        for name in ("step_secs", "floor_per_sec", "free_per_sec"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name}: must be more than 0")
        if self.free_per_sec < self.floor_per_sec:
            raise ValueError("free_per_sec: must be at least floor_per_sec")
        if self.min_pause_secs < 0:
            raise ValueError("min_pause_secs: must be 0 or more")


@dataclass(frozen=True, slots=True)
class Throttle:
    """A destination throttled now. `rate_now` is the jobs per second it allows at this
    moment (0 while paused); `recovers_to` the configured rate it steps back up to (None:
    none is configured, and at `ends_at` it is unlimited again)."""

    kind: str
    key_path: list[str] | None
    key: str
    tenant_id: UUID | None
    reason: str
    refusals: int
    started_at: datetime
    paused_until: datetime
    ends_at: datetime
    recovers_to: float | None
    rate_now: float

    @property
    def destination(self) -> str:
        """`kind` for the kind as a whole, `kind endpoint_id=...` for one key."""
        if not self.key_path:
            return self.kind
        return f"{self.kind} {'.'.join(self.key_path)}={self.key}"

    def describe(self) -> str:
        now = "paused" if self.rate_now == 0 else f"{self.rate_now:.3g}/s"
        to = "unlimited" if self.recovers_to is None else f"{self.recovers_to:g}/s"
        return (f"{self.destination}: {now}, back to {to} by "
                f"{self.ends_at.isoformat(timespec='seconds')} ({self.reason})")


async def throttle_refused(
    engine: AsyncEngine, policy: ThrottlePolicy, *, kind: str, key_path: Sequence[str] | None,
    key: str, tenant_id: UUID | None, pause_secs: float | None, reason: str, actor: str,
) -> bool:
    """Record that the destination refused work; returns whether this started its throttle.
    Never raises for a database error: the refused job's own outcome matters more, and the
    next refusal tries again (logged as `postrelay.throttle.record_failed`)."""
    pause = max(policy.min_pause_secs, pause_secs or 0.0)
    try:
        async with engine.begin() as conn:
            await _end(conn, MAINTENANCE_ACTOR)
        async with engine.begin() as conn:
            row = (await conn.execute(THROTTLES_SQL["job_throttle_refused"], {
                "kind": kind, "key_path": list(key_path) if key_path else None, "key": key,
                "tenant_id": tenant_id, "floor_per_sec": policy.floor_per_sec,
                "step_secs": policy.step_secs, "pause_secs": pause, "reason": reason[:500],
            })).one()
            settled = (await conn.execute(THROTTLES_SQL["job_throttle_settle"], {
                "id": row.id, "free_per_sec": policy.free_per_sec, "started": row.started,
                "actor": actor,
            })).one()
    except Exception as exc:  # see the docstring
        event("postrelay.throttle.record_failed", logging.ERROR, kind=kind, key=key,
              error=repr(exc))
        return False
    name = "postrelay.throttle.started" if row.started else "postrelay.throttle.refused"
    event(name, logging.WARNING, kind=kind, key=key, reason=reason,
          rate_per_sec=round(settled.rate_per_sec, 3),
          paused_until=settled.paused_until.isoformat(), ends_at=settled.ends_at.isoformat(),
          refusals=settled.refusals)
    return bool(row.started)


async def throttle_end(conn: AsyncConnection, *, actor: str = MAINTENANCE_ACTOR) -> int:
    """Delete the throttles whose time is up, each with its `throttle_ended` audit row;
    returns how many."""
    return await _end(conn, actor)


def throttle_list(conn: Connection, *, tenant_id: UUID | str | None = None) -> list[Throttle]:
    """The destinations throttled now; with `tenant_id`, that tenant's and the shared ones."""
    params = {"tenant_id": _uuid_or_none("tenant_id", tenant_id)}
    return [Throttle(kind=r.kind, key_path=r.key_path, key=r.key, tenant_id=r.tenant_id,
                     reason=r.reason, refusals=r.refusals, started_at=r.started_at,
                     paused_until=r.paused_until, ends_at=r.ends_at,
                     recovers_to=r.ceiling_per_sec, rate_now=float(r.rate_now))
            for r in conn.execute(THROTTLES_SQL["job_throttle_list"], params)]


async def _end(conn: AsyncConnection, actor: str) -> int:
    ended = (await conn.execute(THROTTLES_SQL["job_throttle_end"], {"actor": actor})).all()
    for row in ended:
        event("postrelay.throttle.ended", logging.INFO, kind=row.kind, key=row.key,
              refusals=row.refusals, started_at=row.started_at.isoformat(),
              ended_at=row.ends_at.isoformat())
    return len(ended)
