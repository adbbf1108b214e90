"""Stale-claim recovery: jobs of workers that died go back to pending (or to the DLQ when
that claim was their last attempt)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.telemetry import event
from postrelay.queue import queries

BATCH = 1000


@dataclass(frozen=True, slots=True)
class RescueResult:
    pending: int
    dlq: int
    workers_pruned: int


class Rescuer:
    def __init__(self, engine: AsyncEngine, *, lease_secs: float, actor: str) -> None:
        self.engine = engine
        self.lease_secs = lease_secs
        self.actor = actor

    async def run_once(self, now: datetime | None = None) -> RescueResult:
        """Rescue as of `now` (tests pass it), else the database's clock: the one claims
        and heartbeats are written with, whatever this host's clock says."""
        pending = dlq = 0
        while True:
            async with self.engine.begin() as conn:
                rescued = await queries.job_rescue_stale(
                    conn, now=now, lease_secs=self.lease_secs, limit=BATCH, actor=self.actor
                )
            pending += sum(1 for _, status in rescued if status == "pending")
            dlq += sum(1 for _, status in rescued if status == "dlq")
            if len(rescued) < BATCH:
                break
        async with self.engine.begin() as conn:
            pruned = await queries.worker_delete_dead(conn, now=now, lease_secs=self.lease_secs)
            # Cancel requests left for a worker that is gone: its job is failed already.
            await queries.job_cancel_prune(conn)
        if pending or dlq:
            event("postrelay.rescuer.rescued", logging.WARNING, pending=pending, dlq=dlq)
        return RescueResult(pending, dlq, pruned)
