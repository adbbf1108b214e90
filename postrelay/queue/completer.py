"""Write run outcomes in batches.

Finished runs queue up here while the previous batch is being written, so under load each
statement carries many outcomes (one round trip for a hundred jobs) and when idle each
outcome is written at once. A batch that fails to write (connection lost) is kept and
retried: an outcome is never dropped while the process lives. A batch the database refuses
(a row it cannot take, not a lost connection) is written one outcome at a time, so the
others go on; an outcome refused on its own MAX_REFUSALS times is given up: its job goes
to the DLQ without its effects, with an error that says why (outcome.unrecordable).

Outcomes are written on a held connection (heldconn.py): with ten jobs per write, a pool
checkout per write cost about a quarter of the worker's CPU per job. A write is one round
trip: the settings, the effects' statements and the outcomes' go in one pipeline, which
runs as one implicit transaction (dbcall.driver_fetch_after), so the effects and the
outcomes commit together or not at all. An explicit transaction around them cost a BEGIN
and a COMMIT, and each round trip both the server and the worker CPU.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any
from uuid import UUID

import psycopg
from sqlalchemy import TextClause
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.heldconn import HeldConnection
from postrelay.core.service import ErrorBackoff, ServiceLoop
from postrelay.core.telemetry import event
from postrelay.queue import queries
from postrelay.queue.effects import effect_statements
from postrelay.queue.model import Job
from postrelay.queue.outcome import Transition, unrecordable

# The outcomes and their effects commit without waiting for the WAL flush (the setting
# rides with the outcome's statement: queries.job_complete_many, job_finalize_many). Should
# the server crash before it, the transaction is lost whole: the job is rescued and runs
# again, as after any crash mid-job (delivery is at least once), and what the effects
# recorded is learnt again by that run. An email's claim, made durable before DATA, is what
# tells the next attempt that its message may have left. The next durable commit of any
# connection flushes these with it.
RETRY_BASE_SECS = 0.05
MAX_BATCH = 1000  # outcomes per statement: bounded work per write
RETRY_MAX_SECS = 2.0
# Under load, a write whose batch is still small waits this long for more outcomes: the
# statements' work per write is mostly fixed, so fuller batches cost less per job (an email's
# log row and completion cost the server a quarter less in batches of 20 than of 8). A
# batch already FULL_BATCH strong is written at once: waiting would hold back a backlog
# (which holds worker slots: worker.py) and buy little. When idle, an outcome is written at
# once.
LINGER_SECS = 0.005
FULL_BATCH = 32
MAX_REFUSALS = 5  # writes of one outcome the database refused, with the backoff between
# Failures that say nothing about the batch: the connection or the server, not a row.
TRANSIENT = (psycopg.OperationalError, psycopg.InterfaceError, OSError)


def transient(exc: BaseException) -> bool:
    """Whether a failed write says nothing about its outcomes: the connection or the
    server failed, not a row. A write on a fresh connection fails in SQLAlchemy's connect,
    which wraps the driver's error (or times out waiting for the pool): counted as a
    refusal, a database down for two seconds sent finished jobs to the DLQ without their
    effects."""
    if isinstance(exc, (*TRANSIENT, sa_exc.TimeoutError)):
        return True
    return isinstance(exc, sa_exc.DBAPIError) and (
        exc.connection_invalidated or isinstance(exc.orig, TRANSIENT))


class Completer:
    """A write (`run_once`) whenever outcomes are queued; failed writes back off."""

    def __init__(
        self, engine: AsyncEngine, worker_id: str, on_written: Callable[[], None] | None = None
    ) -> None:
        self._held = HeldConnection(engine)
        self.worker_id = worker_id
        self.on_written = on_written  # the worker claims again once a backlog shrinks
        self._queue: list[tuple[Job, Transition]] = []
        self._writing: list[tuple[Job, Transition]] = []
        self._idle = asyncio.Event()
        self._idle.set()
        self._busy = False  # the last write carried more than one outcome
        self._alone = 0  # writes of one outcome each still to make, after a refused batch
        self._refusals: dict[UUID, int] = {}  # job id: refused writes of its outcome alone
        self._superseded: set[UUID] = set()  # jobs whose outcome is expected to be skipped
        self._loop = ServiceLoop("completer", self.run_once, self._next_wait,
                                 backoff=ErrorBackoff(RETRY_BASE_SECS, RETRY_MAX_SECS),
                                 first_wait=None, failed_event="postrelay.completer.write_failed")
        self._ready = self._loop.wake  # set by add(): outcomes are queued
        self.written = 0
        self.skipped = 0  # outcomes whose guard failed: the job was rescued meanwhile

    def add(self, job: Job, transition: Transition, *, superseded: bool = False) -> None:
        """Queue the outcome of a run. `superseded`: the job was moved on meanwhile (an
        operator cancelled it), so its state is not expected to change; only the run's
        effects are written, and the skip is not warned of."""
        if superseded:
            self._superseded.add(job.id)
        self._queue.append((job, transition))
        self._idle.clear()
        self._ready.set()

    async def start(self) -> None:
        self._loop.start()

    async def stop(self, timeout_secs: float = 30.0) -> None:
        """Write everything still queued (trying for up to `timeout_secs` while the
        database is unreachable), then stop. Whatever could not be written stays
        `running` in the database and is rescued after the lease."""
        try:
            async with asyncio.timeout(timeout_secs):
                await self._idle.wait()
        except TimeoutError:
            event("postrelay.completer.abandoned", logging.ERROR, unwritten=len(self._queue),
                  reason="database unreachable at shutdown; the rescuer will recover them")
        await self._loop.stop()
        await self._held.close()

    async def run_once(self) -> int:
        """Write the queued outcomes (up to MAX_BATCH); returns how many were written. A
        batch that fails to write is queued again (`_requeue`), and raises."""
        if self._busy and len(self._queue) < FULL_BATCH:  # let more join this write
            await asyncio.sleep(LINGER_SECS)
        self._ready.clear()  # what arrived during the linger is in this batch
        size = 1 if self._alone else MAX_BATCH
        batch, self._queue = self._queue[:size], self._queue[size:]
        self._busy = len(batch) > 1
        self._writing = batch
        try:
            written = await self._write(batch)
        except Exception as exc:  # keep the batch and try again after the backoff
            self._requeue(batch, exc)
            raise
        finally:
            self._writing = []
        if len(batch) == 1:
            self._alone = max(0, self._alone - 1)
            self._refusals.pop(batch[0][0].id, None)
        if batch and self.on_written is not None:
            self.on_written()
        if not self._queue:
            self._idle.set()
        return written

    def _requeue(self, batch: list[tuple[Job, Transition]], exc: Exception) -> None:
        """Queue a batch that failed to write again: at the front, unless the database
        refused it. Then each of its outcomes is written on its own, and one refused on its
        own waits behind the others, until it is replaced by outcome.unrecordable after
        MAX_REFUSALS refusals."""
        if transient(exc):  # the batch is not at fault
            self._queue[:0] = batch
            return
        if len(batch) > 1:  # one of its outcomes is: write each on its own
            self._alone = len(batch)
            self._queue[:0] = batch
            return
        [(job, transition)] = batch
        refusals = self._refusals.get(job.id, 0) + 1
        if refusals < MAX_REFUSALS:
            self._refusals[job.id] = refusals
            self._queue.append((job, transition))
            return
        self._refusals.pop(job.id, None)
        event("postrelay.completer.outcome_unrecordable", logging.ERROR, job_id=str(job.id),
              status=transition.status, error=repr(exc))
        self._queue.insert(0, (job, unrecordable(transition, exc, refusals)))

    def _next_wait(self, _: int) -> float | None:
        """At once while outcomes are queued; else until add() queues one."""
        return 0.0 if self._queue else None

    async def _write(self, batch: list[tuple[Job, Transition]]) -> int:
        if not batch:
            return 0
        effects = effect_statements([effect for _, t in batch for effect in t.effects])
        async with self._held.use() as conn:
            written = await self._finalize(conn, batch, effects)
        self.written += len(written)
        if len(written) < len(batch):
            lost = [job for job, _ in batch if job.id not in written]
            self.skipped += len(lost)
            for job in lost:
                if job.id not in self._superseded:
                    event("postrelay.job.finalize_skipped", logging.WARNING,
                          job_id=str(job.id),
                          reason="no longer running under this worker's claim (rescued)")
        if self._superseded:  # almost never: only cancelled runs' outcomes are in it
            self._superseded.difference_update(job.id for job, _ in batch)
        return len(written)

    async def _finalize(
        self,
        conn: psycopg.AsyncConnection[Any],
        batch: list[tuple[Job, Transition]],
        effects: list[tuple[TextClause, Any]],
    ) -> set[UUID]:
        flush = not effects  # outcomes with effects commit without it: see above
        if all(t.status == "done" and t.error is None for _, t in batch):
            return await queries.job_complete_many(
                conn,
                worker=self.worker_id,
                ids=[job.id for job, _ in batch],
                attempts=[job.attempts for job, _ in batch],
                flush=flush,
                effects=effects,
            )
        return await queries.job_finalize_many(
            conn,
            flush=flush,
            effects=effects,
            worker=self.worker_id,
            ids=[job.id for job, _ in batch],
            attempts=[job.attempts for job, _ in batch],
            statuses=[t.status for _, t in batch],
            delays=[t.delay_secs for _, t in batch],
            errors=[t.error for _, t in batch],
            refunds=[t.refund for _, t in batch],
        )

    @property
    def backlog(self) -> int:
        """Outcomes not yet written."""
        return len(self._queue) + len(self._writing)

    def pending_ids(self) -> set[UUID]:
        """Jobs whose outcome is queued or being written right now."""
        return {job.id for job, _ in (*self._queue, *self._writing)}
