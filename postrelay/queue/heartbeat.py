"""The worker's heartbeat: its mdm.aa_worker row, kept fresh, tells the rescuer that the
jobs it claimed are alive; and jobs claimed under its id that it no longer holds (a claim
whose reply was lost with the connection) go back to pending.

A worker silent for longer than the lease (stopped, frozen, cut off from the database) has
its row pruned as dead, and what was addressed to it meanwhile with it (cancel requests);
the beat that finds the row gone registers again and then runs `on_returned`, until it has
once succeeded, for the worker to catch up with what it missed.

One beat is `run_once()`; the worker runs it every `interval_secs`, several times per job
lease, so one slow beat never looks like a dead worker.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.service import periodic
from postrelay.core.telemetry import event
from postrelay.queue import queries


@dataclass(frozen=True, slots=True)
class Beat:
    registered_again: bool  # the row was gone (pruned while the database was away)
    orphans_released: int


class Heartbeat:
    def __init__(
        self,
        engine: AsyncEngine,
        worker_id: str,
        *,
        interval_secs: float,
        register: Callable[[], Awaitable[None]],
        held_ids: Callable[[], set[UUID]],
        on_released: Callable[[], None],
        on_returned: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.engine = engine  # single statements: an autocommit engine spares BEGIN/COMMIT
        self.worker_id = worker_id
        self.interval_secs = interval_secs
        self._register = register
        self._held_ids = held_ids  # every job the worker holds or has an outcome queued for
        self._on_released = on_released
        self._on_returned = on_returned
        self._returned = False  # registered again, and on_returned has not yet succeeded
        # The worker registered as it started: the first beat is one interval later.
        self._loop = periodic("heartbeat", self.run_once, interval_secs,
                              first_wait=interval_secs,
                              failed_event="postrelay.worker.heartbeat_failed")

    async def run_once(self) -> Beat:
        async with self.engine.connect() as conn:
            alive = await queries.worker_heartbeat(conn, id=self.worker_id)
        if not alive:
            # Our row was pruned (e.g. the database was gone longer than the lease); come
            # back, so our remaining jobs are not rescued.
            await self._register()
            self._returned = True
        if self._returned and self._on_returned is not None:
            # After registering: whatever is addressed to us from now on is kept for us.
            await self._on_returned()
        self._returned = False
        return Beat(not alive, await self._release_orphans())

    async def _release_orphans(self) -> int:
        known = list(self._held_ids())
        async with self.engine.connect() as conn:
            released = await queries.job_release_orphans(
                conn, worker=self.worker_id, known=known, min_age_secs=self.interval_secs)
        if released:
            event("postrelay.worker.orphans_released", logging.WARNING, count=len(released),
                  reason="claimed in the database but not held by this worker")
            self._on_released()
        return len(released)

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
