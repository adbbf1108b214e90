"""Jobs an operator cancelled while this worker holds them (mdm.aa_job_cancel).

A poll, not LISTEN, so that it works behind a transaction pooler too: one indexed DELETE
of no rows every CANCEL_CHECK_SECS, and only while the worker holds jobs. The job is
`failed` in the database already; `run_once()` takes the requests and has the worker stop
those runs.

A request outlives its worker's row only until the leader's next round (the rescuer prunes
both), but a worker pruned as dead may only have been silent for longer than the lease: when
it registers again, `catch_up()` reads the states of the jobs it runs, and stops those
cancelled meanwhile, so no cancel is lost with its request.
"""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.service import periodic
from postrelay.queue import queries

CANCEL_CHECK_SECS = 0.5


class CancelCheck:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        worker_id: str,
        held_ids: Callable[[], set[UUID]],
        cancel: Callable[[UUID, str], None],
        interval_secs: float = CANCEL_CHECK_SECS,
    ) -> None:
        self.engine = engine  # one statement: an autocommit engine spares BEGIN/COMMIT
        self.worker_id = worker_id
        self._held_ids = held_ids
        self._cancel = cancel
        # A failed check is asked again at the next one; the job is failed already.
        self._loop = periodic("cancel", self.run_once, interval_secs,
                              first_wait=interval_secs,
                              failed_event="postrelay.worker.cancel_check_failed")

    async def run_once(self) -> int:
        """Stop the held jobs whose cancellation was asked for; returns how many."""
        held = self._held_ids()
        if not held:
            return 0
        async with self.engine.connect() as conn:
            taken = await queries.job_cancel_take(conn, ids=list(held))
        for job_id, actor in taken:
            self._cancel(job_id, actor)
        return len(taken)

    async def catch_up(self) -> int:
        """Stop the held jobs cancelled while this worker's row was gone (their requests
        were pruned with it); returns how many."""
        held = self._held_ids()
        if not held:
            return 0
        async with self.engine.connect() as conn:
            missed = await queries.job_cancel_missed(conn, worker=self.worker_id,
                                                     ids=list(held))
        for job_id, actor in missed:
            self._cancel(job_id, actor)
        return len(missed)

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
