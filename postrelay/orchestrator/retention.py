"""Email log retention: rows older than POSTRELAY_EMAIL_LOG_RETENTION_DAYS are deleted in
bounded batches by the `cleanup_jobs` job of the built-in cron entry
`postrelay.email-log-retention`. Unset (the default), the log is kept: how long to remember
what was sent to whom is the operator's decision (bounces and complaints, legal holds).

Deleted rows leave dead tuples that autovacuum turns into free space which the next
messages fill, so with a window the table stops growing at about the window's worth of
rows; the batches are short transactions that never hold many locks or a long snapshot.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.orchestrator.queries import EMAIL_SQL

EMAIL_LOG_TARGET = "email_log"


async def email_log_delete_batch(engine: AsyncEngine, before: datetime, batch: int) -> int:
    """Delete at most `batch` log rows created before `before`; returns how many."""
    async with engine.begin() as conn:
        result = await conn.execute(EMAIL_SQL["email_log_delete_before"],
                                    {"before": before, "batch": batch})
    return result.rowcount
