"""The flow-control state the maintenance leader tidies each round: throttles whose time
is up end (with their audit rows), and limit buckets idle long enough to be full again are
deleted, so that per-key limits over many keys keep only the keys in use."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.telemetry import event
from postrelay.queue.limits import LIMITS_SQL
from postrelay.queue.throttles import MAINTENANCE_ACTOR, throttle_end

PRUNE_BATCH = 1000
MAX_PRUNE_BATCHES = 100  # per round; a larger backlog goes on next round


@dataclass(frozen=True, slots=True)
class FlowResult:
    throttles_ended: int
    buckets_pruned: int


class FlowKeeper:
    def __init__(self, engine: AsyncEngine, *, actor: str = MAINTENANCE_ACTOR) -> None:
        self.engine = engine
        self.actor = actor

    async def run_once(self) -> FlowResult:
        async with self.engine.begin() as conn:
            ended = await throttle_end(conn, actor=self.actor)
        pruned = 0
        for _ in range(MAX_PRUNE_BATCHES):
            async with self.engine.begin() as conn:
                deleted = (await conn.execute(LIMITS_SQL["job_limit_bucket_prune"],
                                              {"batch": PRUNE_BATCH})).rowcount
            pruned += deleted
            if deleted < PRUNE_BATCH:
                break
        if pruned:
            event("postrelay.limits.buckets_pruned", logging.DEBUG, count=pruned)
        return FlowResult(ended, pruned)
