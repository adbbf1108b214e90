"""Run one claimed job and turn whatever happened into a Transition."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time

from postrelay.core.telemetry import event
from postrelay.queue.backoff import Backoff
from postrelay.queue.effects import collecting
from postrelay.queue.handler_result import outcome_of
from postrelay.queue.model import Job
from postrelay.queue.outcome import (
    Failure,
    Outcome,
    PermanentError,
    Returned,
    Transition,
    decide,
    undecidable,
)
from postrelay.queue.registry import Registry


class JobTimeout(Exception):  # noqa: N818 - reads as the outcome it is
    """The handler ran longer than its kind's timeout."""


class Executor:
    def __init__(
        self, registry: Registry, backoff: Backoff, default_timeout_secs: float | None
    ) -> None:
        self.registry = registry
        self.backoff = backoff
        self.default_timeout_secs = default_timeout_secs

    async def execute(self, job: Job) -> Transition:
        """Run `job`; never raises except CancelledError-turned-Returned at shutdown."""
        started = time.perf_counter()
        with collecting() as effects:
            outcome = await self._outcome(job)
        try:
            transition = decide(job, outcome, self.backoff)
        except Exception as exc:  # the run must end in a state, or its job is held for ever
            transition = undecidable(job, exc)
        if effects:
            transition = dataclasses.replace(transition, effects=tuple(effects))
        if transition.status != "done":
            event(
                "postrelay.job.finished",
                logging.INFO if transition.status == "pending" else logging.WARNING,
                job_id=str(job.id),
                kind=job.kind,
                attempt=job.attempts,
                status=transition.status,
                duration_ms=round((time.perf_counter() - started) * 1000, 2),
                error=(transition.error or "").splitlines()[-1:] or None,
            )
        return transition

    async def _outcome(self, job: Job) -> Outcome:
        if job.unreadable_payload is not None:  # no attempt can read it: to the DLQ at once
            return Failure(PermanentError(
                f"the job's payload cannot be read: {job.unreadable_payload}"))
        handler = self.registry.get(job.kind)
        if handler is None:  # claimed only by kind, so this means a misconfigured registry
            return Failure(PermanentError(f"no handler registered for kind {job.kind!r}"))
        timeout = handler.timeout_secs or self.default_timeout_secs
        # Without a timeout, no deadline at all: an idle asyncio.timeout() still costs a
        # noticeable share of a short job's run.
        deadline = asyncio.timeout(timeout) if timeout is not None else None
        try:
            async with deadline or contextlib.nullcontext():
                result = await handler.fn(job)
            # In the try: reading what the handler returned runs the value's own code
            # (its __class__, for isinstance), which may raise as well.
            return outcome_of(result)
        except BaseException as exc:  # whatever the handler raised ends its run here
            # Once the worker has cancelled the run (shutdown, an operator's cancel), what
            # it ends in is the cancel's doing, even an error its cleanup raised: the job
            # is handed back uncounted. Counted, a worker's restart burnt an attempt of
            # every such run, and dead-lettered those on their last. The deadline's own
            # cancel is not counted here: it surfaces as TimeoutError.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                return Returned()
            if isinstance(exc, TimeoutError) and deadline is not None and deadline.expired():
                return Failure(JobTimeout(f"job exceeded its timeout of {timeout:g} s"))
            # Anything else is a failed attempt: a CancelledError no one asked of this
            # task (an awaited future someone else cancelled; handed back, the job would
            # run again for ever, its attempts never counted), and SystemExit,
            # KeyboardInterrupt, GeneratorExit or a BaseException of the handler's own,
            # as Oban, River and Sidekiq record a job's exit, panic or Interrupt. Let
            # through, it ended the task with its job held `running` under a live
            # heartbeat, or ended the process, and every worker that claimed the job
            # again. Signals reach the worker as signals (run_until_signalled), never as
            # an exception in a handler.
            return Failure(exc)
