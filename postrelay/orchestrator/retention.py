"""Email log retention: rows older than POSTRELAY_EMAIL_LOG_RETENTION_DAYS are deleted in
bounded batches by the `cleanup_jobs` job of the built-in cron entry
`postrelay.email-log-retention`. Unset (the default), the log is kept: how long to remember
what was sent to whom is the operator's decision (bounces and complaints, legal holds).

Delivery feedback (aa_email_feedback) goes the same way under its own entry,
`postrelay.email-feedback-retention`: by default with the log rows it names, so that
feedback does not outlive them; never sooner than the soft-bounce window, whose count reads
it. The suppression list has no window: it is what stops mail to bad addresses; the audit
of lifted suppressions goes with the other audits (POSTRELAY_AUDIT_RETENTION_DAYS), but
never sooner than the soft-bounce window either: a lift's row is where an address's
soft-bounce count starts afresh.

Deleted rows leave dead tuples that autovacuum turns into free space which the next
messages fill, so with a window the table stops growing at about the window's worth of
rows; the batches are short transactions that never hold many locks or a long snapshot.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.settings import Settings
from postrelay.orchestrator.feedback.queries import FEEDBACK_SQL
from postrelay.orchestrator.queries import EMAIL_SQL
from postrelay.queue import DeleteBatch

EMAIL_LOG_TARGET = "email_log"
EMAIL_FEEDBACK_TARGET = "email_feedback"


async def email_log_delete_batch(engine: AsyncEngine, before: datetime, batch: int) -> int:
    """Delete at most `batch` log rows created before `before`; returns how many."""
    async with engine.begin() as conn:
        result = await conn.execute(EMAIL_SQL["email_log_delete_before"],
                                    {"before": before, "batch": batch})
    return result.rowcount


def feedback_retention_days(settings: Settings) -> float | None:
    """The feedback's window: its own setting, else the log's (None: kept), never shorter
    than the soft-bounce window (the setting's validator refuses a shorter one)."""
    days = settings.email_feedback_retention_days or settings.email_log_retention_days
    return None if days is None else max(days, settings.email_soft_bounce_window_days)


async def email_feedback_delete_batch(engine: AsyncEngine, before: datetime, batch: int) -> int:
    """Delete at most `batch` feedback rows received before `before`; returns how many."""
    async with engine.begin() as conn:
        result = await conn.execute(FEEDBACK_SQL["email_feedback_delete_before"],
                                    {"before": before, "batch": batch})
    return result.rowcount


async def email_suppression_audit_delete_batch(engine: AsyncEngine, before: datetime,
                                               batch: int, *, keep_secs: float = 0.0) -> int:
    """Delete at most `batch` suppression audit rows created before `before` (the `audit`
    target's, with the queue's audits), none of the last `keep_secs` by the database's
    clock; returns how many."""
    async with engine.begin() as conn:
        result = await conn.execute(FEEDBACK_SQL["email_suppression_audit_delete_before"],
                                    {"before": before, "batch": batch, "keep_secs": keep_secs})
    return result.rowcount


def suppression_audit_delete_batch(settings: Settings) -> DeleteBatch:
    """The suppression audit's part of the `audit` target: its rows go under the audits'
    window, but none younger than the soft-bounce window. Without the row of a lift, soft
    bounces from before it would count again, and suppress the address just lifted. Both
    windows are measured on the database's clock, as `before` is (queue/maintenance/
    retention.py): a host whose clock is off must not delete a lift the window keeps."""
    keep_secs = settings.email_soft_bounce_window_days * 86400.0

    async def delete_batch(engine: AsyncEngine, before: datetime, batch: int) -> int:
        return await email_suppression_audit_delete_batch(engine, before, batch,
                                                          keep_secs=keep_secs)
    return delete_batch
