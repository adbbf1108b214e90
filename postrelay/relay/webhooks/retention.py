"""Retention of the delivery log: aa_webhook_attempt rows outlive their jobs (which are
deleted after 14 days) but not forever.

`webhook_attempt_delete_batch` has the shape of the queue's retention `DeleteBatch`, so the
worker can register it as a `cleanup_jobs` target:

    cleanup_handler(engine, days, extra={"webhook_attempts": Cleaner(
        webhook_attempt_delete_batch, settings.webhook_attempt_retention_days)})
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.relay.webhooks.endpoints import WEBHOOK_SQL

DEFAULT_ATTEMPT_RETENTION_DAYS = 30.0  # POSTRELAY_WEBHOOK_ATTEMPT_RETENTION_DAYS' default


async def webhook_attempt_delete_batch(engine: AsyncEngine, before: datetime, batch: int) -> int:
    """Delete at most `batch` attempts recorded before `before`; returns how many."""
    async with engine.begin() as conn:
        result = await conn.execute(WEBHOOK_SQL["webhook_attempt_delete_before"],
                                    {"before": before, "batch": batch})
    return result.rowcount
