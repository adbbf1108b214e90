"""Retention: `done` jobs older than the window are hard-deleted by a `cleanup_jobs` job.

The job comes from the built-in cron entry `postrelay.retention` (hourly, created by
migration 0002). The handler deletes in bounded batches, each in its own short
transaction, and never touches dlq, failed or pending rows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.clock import utcnow
from postrelay.core.telemetry import event
from postrelay.queue import queries
from postrelay.queue.model import Job

RETENTION_KIND = "cleanup_jobs"
DELETE_BATCH = 1000
MAX_BATCHES_PER_RUN = 1000  # a backlog larger than a million rows continues next hour


async def delete_done_before(engine: AsyncEngine, before: datetime) -> int:
    deleted = 0
    for _ in range(MAX_BATCHES_PER_RUN):
        async with engine.begin() as conn:
            n = await queries.job_delete_done_before(conn, before=before, batch=DELETE_BATCH)
        deleted += n
        if n < DELETE_BATCH:
            break
    return deleted


def cleanup_handler(
    engine: AsyncEngine, default_days: float
) -> Callable[[Job], Awaitable[None]]:
    """The built-in handler for `cleanup_jobs`."""

    async def cleanup_jobs(job: Job) -> None:
        # An empty payload (the built-in entry's) means the worker's configured window.
        days = float(job.payload.get("retention_days", default_days))
        before = utcnow() - timedelta(days=days)
        deleted = await delete_done_before(engine, before)
        event("postrelay.retention.deleted", deleted=deleted, before=before.isoformat())

    return cleanup_jobs
