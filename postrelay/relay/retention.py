"""Outbox retention: handled events are deleted after a window (default 7 days) by the
`cleanup_jobs` job of the built-in cron entry `postrelay.outbox-retention`."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.relay.queries import OUTBOX_SQL

OUTBOX_TARGET = "outbox"


async def delete_handled_batch(engine: AsyncEngine, before: datetime, batch: int) -> int:
    async with engine.begin() as conn:
        result = await conn.execute(OUTBOX_SQL["outbox_delete_handled_before"],
                                    {"before": before, "batch": batch})
    return result.rowcount
