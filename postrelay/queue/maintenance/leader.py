"""The maintenance loop: whichever worker holds the `maintenance` lease runs the rescuer;
the others only try to take the lease."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.service import Looper
from postrelay.queue import queries
from postrelay.queue.maintenance.rescuer import Rescuer

LEASE_NAME = "maintenance"


class Maintenance(Looper):
    name = "maintenance"

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        holder: str,
        interval_secs: float,
        rescuer: Rescuer,
    ) -> None:
        super().__init__(interval_secs)
        self.engine = engine
        self.holder = holder
        self.rescuer = rescuer

    async def run_once(self) -> bool:
        """One round; returns whether this process was the leader."""
        async with self.engine.begin() as conn:
            # The lease outlives a few missed rounds, so leadership does not flap.
            leader = await queries.lease_acquire(
                conn, name=LEASE_NAME, holder=self.holder, ttl_secs=self.interval_secs * 3
            )
        if not leader:
            return False
        await self.rescuer.run_once()
        return True

    async def stop(self) -> None:
        await super().stop()
        try:
            async with self.engine.begin() as conn:
                await queries.lease_release(conn, name=LEASE_NAME, holder=self.holder)
        except Exception:  # the lease expires by itself
            pass
