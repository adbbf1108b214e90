"""Email jobs made ready when they are claimed, before a slot runs them.

The worker tells the `email_send` handler of each claim's jobs (the queue's `on_claim`
hook). For each job, its payload and addresses are read, and the read before sending
(sending.py) is started for the whole claim in one round trip, without waiting for
company. A run that starts within EARLY_SECS takes both over (`take`); otherwise, or
for a job whose payload or addresses are wrong, the run does its own, as the handler's
steps describe.

    claimed = ClaimedJobs(checks, parse=sender.parse)
    claimed.claimed(jobs)          # the claim hook
    ready = claimed.take(job)      # in the run: Ready, or None
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar
from uuid import UUID

from postrelay.core.errors import ValidationError
from postrelay.orchestrator.attempts import SendCheck
from postrelay.orchestrator.sending import SendCheckBatcher
from postrelay.queue import Job

# How long a read started at the claim serves its run: a run that starts later reads again
# (a recipient may have been suppressed meanwhile).
EARLY_SECS = 1.0
P = TypeVar("P")  # what `parse` makes of a job


@dataclass(frozen=True, slots=True)
class Ready(Generic[P]):
    parsed: P
    recipients: list[str]  # the envelope's, lower-cased: what the read was for
    check: asyncio.Future[SendCheck]


class ClaimedJobs(Generic[P]):
    """`parse(job)` returns what the run needs of the job alone and the envelope
    recipients, or raises ValidationError."""

    def __init__(self, checks: SendCheckBatcher,
                 parse: Callable[[Job], tuple[P, list[str]]]) -> None:
        self.checks = checks
        self.parse = parse
        # By (job id, claim moment): the claim an entry belongs to, and when it was made.
        self._ready: dict[tuple[UUID, datetime], tuple[Ready[P], float]] = {}

    def claimed(self, jobs: Sequence[Job]) -> None:
        now = time.monotonic()
        self._drop_older_than(now - EARLY_SECS)
        parsed: list[tuple[Job, P, list[str]]] = []
        rows: list[dict[str, Any]] = []
        for job in jobs:
            try:
                what, recipients = self.parse(job)
            except ValidationError:
                continue  # its run fails it, with the reason
            parsed.append((job, what, recipients))
            rows.append({"job_id": str(job.id), "tenant_id": str(job.tenant_id),
                         "recipients": recipients})
        if not rows:  # an empty start would still end the next read's wait for company
            return
        for (job, what, recipients), check in zip(parsed, self.checks.start(rows),
                                                  strict=True):
            self._ready[(job.id, job.claimed_at)] = (Ready(what, recipients, check), now)

    def take(self, job: Job) -> Ready[P] | None:
        """What was made ready for this run of `job`, if it is still fresh."""
        entry = self._ready.pop((job.id, job.claimed_at), None)
        if entry is None:
            return None
        ready, made = entry
        if time.monotonic() - made >= EARLY_SECS:
            ready.check.cancel()
            return None
        return ready

    def clear(self) -> None:
        for ready, _ in self._ready.values():
            ready.check.cancel()
        self._ready.clear()

    def _drop_older_than(self, moment: float) -> None:
        """Oldest first: entries of jobs that never ran here (handed back at a stop, or
        after being held too long)."""
        while self._ready:
            key, (ready, made) = next(iter(self._ready.items()))
            if made >= moment:
                return
            del self._ready[key]
            ready.check.cancel()
