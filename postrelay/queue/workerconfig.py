"""A worker's settings, checked as they are made.

The CLI's settings are checked by pydantic (core/settings.py); a worker built in code gets
these checks instead, with the same bounds. Unchecked, a lease or poll interval of 0 made
the heartbeat or the claim loop spin against the database, NaN made their waits fail or
never end, and a concurrency past the worker row's integer column stopped the worker at
its start with the database's words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from uuid import UUID

from postrelay.core.settings import MAX_WORKER_CONCURRENCY


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    concurrency: int = 10
    tenants: tuple[UUID, ...] | None = None  # None: every tenant
    kinds: tuple[str, ...] | None = None  # None: every kind the registry handles
    poll_interval_secs: float = 1.0
    lease_secs: float = 450.0
    grace_secs: float = 30.0
    default_timeout_secs: float | None = None
    listen: bool = True
    claim_ahead_secs: float = 0.03  # 0: claim only for free slots
    # Share each claim across the tenants waiting at the most urgent priority level
    # (sql/claim.sql, job_claim_fair); False: strictly by priority and due time.
    fair: bool = True
    tenant_weights: dict[UUID, int] | None = None  # a tenant not named weighs 1

    def __post_init__(self) -> None:
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) \
                or not 1 <= self.concurrency <= MAX_WORKER_CONCURRENCY:
            raise ValueError(f"concurrency: must be a whole number from 1 to "
                             f"{MAX_WORKER_CONCURRENCY}, got {self.concurrency!r}")
        _seconds("poll_interval_secs", self.poll_interval_secs, zero=False)
        _seconds("lease_secs", self.lease_secs, zero=False)
        _seconds("grace_secs", self.grace_secs, zero=True)
        _seconds("claim_ahead_secs", self.claim_ahead_secs, zero=True)
        if self.default_timeout_secs is not None:  # math.inf: no limit, as a handler's
            _seconds("default_timeout_secs", self.default_timeout_secs, zero=False,
                     infinite=True)

    @property
    def heartbeat_secs(self) -> float:
        # Several beats per lease, so one slow beat never looks like a dead worker.
        return min(self.lease_secs / 5, 30.0)


def _seconds(field: str, value: object, *, zero: bool, infinite: bool = False) -> None:
    ok = (isinstance(value, int | float) and not isinstance(value, bool)
          and (value >= 0 if zero else value > 0) and (infinite or math.isfinite(value)))
    if not ok:
        rule = "0 or more" if zero else "more than 0"
        raise ValueError(f"{field}: must be a number of seconds, {rule}"
                         f"{'' if infinite else ', and finite'}, got {value!r}")
