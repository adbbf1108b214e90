"""How much a worker claims and when, from how long its runs take.

    pace = ClaimPace(concurrency=20, claim_ahead_secs=0.03)
    pace.ran(0.004)                        # each run's time, into a moving average
    capacity = 20 + pace.ahead()           # the slots, and the jobs worth claiming ahead
    if free < capacity // pace.gather_part() and pace.gather_wait() > 0: ...  # not yet

Claiming ahead: a worker whose recent runs were short claims, beyond its free slots, as
many jobs as it would start within `claim_ahead_secs` at that pace: at most nine per slot
and CLAIM_AHEAD_MAX_JOBS in all. A claim then carries tens of jobs where free slots alone
allow a few (a claim of 50 rows costs little more than one of 10): at concurrency 10 a
worker drained no-op jobs twice as fast. A job held ahead waits about `claim_ahead_secs`
for its slot. Slow jobs are never claimed ahead: they stay claimable by idle workers. When
short runs are followed by long ones, held jobs may wait for far longer: once the first has
waited HOLD_LIMIT_FACTOR times `claim_ahead_secs`, and never more than HOLD_LIMIT_SECS, all
are handed back uncounted for any worker to take, and the worker claims only for free slots
until its runs are short again. So jobs held before a pause of their kind start for a
second after it at most.

Gathering: a saturated worker lets freed slots gather, up to part of its capacity or for
at most CLAIM_GATHER_SECS, before it claims: its jobs end one at a time, and a claim's cost
is mostly the same for one job or twenty. The part is a quarter while runs are short (the
jobs held ahead must not run out before the claim returns) and half once they take longer
than `claim_ahead_secs`. An unsaturated worker claims at once, so pickup latency is
untouched.
"""

from __future__ import annotations

import time

CLAIM_GATHER_SECS = 0.025
CLAIM_AHEAD_MAX_PER_SLOT = 9
CLAIM_AHEAD_MAX_JOBS = 100
HOLD_LIMIT_FACTOR = 100
HOLD_LIMIT_SECS = 1.0
RUN_TIME_WEIGHT = 0.1  # of the newest run in the moving average of run times


class ClaimPace:
    def __init__(self, *, concurrency: int, claim_ahead_secs: float) -> None:
        self.concurrency = concurrency
        self.claim_ahead_secs = claim_ahead_secs
        self.mean_run_secs: float | None = None  # moving average; None before any run
        self._gather_until: float | None = None  # while freed slots gather

    def ran(self, took: float) -> None:
        """A run ended after `took` seconds."""
        mean = self.mean_run_secs
        self.mean_run_secs = took if mean is None else mean + RUN_TIME_WEIGHT * (took - mean)

    def ahead(self) -> int:
        """How many jobs to claim beyond the free slots."""
        mean = self.mean_run_secs
        if mean is None or self.claim_ahead_secs <= 0:
            return 0
        startable = self.claim_ahead_secs * self.concurrency / max(mean, 1e-6)
        return min(int(startable), CLAIM_AHEAD_MAX_PER_SLOT * self.concurrency,
                   CLAIM_AHEAD_MAX_JOBS)

    @property
    def hold_limit_secs(self) -> float:
        """How long the first job held ahead may wait before all are handed back."""
        return min(self.claim_ahead_secs * HOLD_LIMIT_FACTOR, HOLD_LIMIT_SECS)

    def held_too_long(self, waited: float) -> None:
        """Held jobs were handed back after `waited` seconds: reckon runs at least that
        long, so nothing is claimed ahead until short runs bring the average down."""
        self.mean_run_secs = max(self.mean_run_secs or 0.0, waited)

    def gather_part(self) -> int:
        """Which part of its capacity a saturated worker lets gather before it claims."""
        mean = self.mean_run_secs
        if mean is not None and mean > self.claim_ahead_secs:
            return 2  # long runs: few held ahead, slots free slowly
        return 4  # short runs: the held jobs must not run out before the claim returns

    def gather_wait(self, now: float | None = None) -> float:
        """Seconds left to let freed slots gather before claiming them (0 or less: claim
        now); the first call starts the gathering."""
        now = time.monotonic() if now is None else now
        if self._gather_until is None:
            self._gather_until = now + CLAIM_GATHER_SECS
        return self._gather_until - now

    def claiming(self) -> None:
        """A claim is being made: the next gathering starts afresh."""
        self._gather_until = None
