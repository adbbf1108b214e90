"""The cron scheduler: runs in every worker, fires each due slot exactly once.

Every tick reads the entries, finds those with a slot due since their last run, and fires
the latest such slot: claim it on the entry row (cron_claim_slot) and enqueue the job with
an idempotency key of entry + slot, in one transaction. Several schedulers may race for a
slot; the row lock and the key let exactly one job through.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.service import periodic
from postrelay.core.telemetry import event
from postrelay.queue.cron import CRON_SQL, slots_between
from postrelay.queue.enqueue import enqueue_async


@dataclass(frozen=True, slots=True)
class Fired:
    name: str
    slot: datetime


class CronScheduler:
    """The cron round (`run_once`: the slots it fired) every `interval_secs`."""

    def __init__(self, engine: AsyncEngine, *, interval_secs: float = 1.0) -> None:
        self.engine = engine
        self.interval_secs = interval_secs
        self._loop = periodic("cron", self.run_once, interval_secs)

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def run_once(self, now: datetime | None = None) -> list[Fired]:
        """Fire the due slots as of `now` (tests pass it), else the database's time."""
        async with self.engine.connect() as conn:
            entries = (await conn.execute(CRON_SQL["cron_schedule_all"])).all()
        fired = []
        for entry_id, schedule, created_at, last_run, db_now in entries:
            try:
                due = slots_between(schedule, last_run or created_at, now or db_now)
                if due is not None and (result := await self._fire(entry_id, *due)):
                    fired.append(result)
            except Exception as exc:  # one broken entry must not stop the others
                event("postrelay.cron.entry_failed", logging.WARNING, entry=str(entry_id),
                      schedule=schedule, error=repr(exc))
        return fired

    async def _fire(self, entry_id: object, slot: datetime, next_run: datetime) -> Fired | None:
        async with self.engine.begin() as conn:
            row = (await conn.execute(
                CRON_SQL["cron_claim_slot"], {"id": entry_id, "slot": slot, "next_run": next_run}
            )).first()
            if row is None:  # another scheduler fired it, or the entry was deleted
                return None
            name, tenant_id, kind, payload, priority, max_attempts = row
            await enqueue_async(
                conn, kind, payload if isinstance(payload, dict) else json.loads(payload),
                tenant_id=tenant_id, priority=priority, max_attempts=max_attempts,
                idempotency_key=f"cron:{entry_id}:{slot.isoformat()}", created_by=f"cron:{name}",
            )
        event("postrelay.cron.fired", name=name, slot=slot.isoformat())
        return Fired(name, slot)
