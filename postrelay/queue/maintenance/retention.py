"""Retention: `cleanup_jobs` jobs delete what has outlived its window, in bounded batches.

The jobs come from built-in cron entries (hourly): `postrelay.retention` deletes `done` jobs
(never dlq, failed or pending ones); other layers add their own targets, such as the
outbox's handled events, by registering a `Cleaner` under the name their cron entry's
payload gives as `target`. The queue itself knows only its own target, "jobs". Each
target's window is configured (the settings), never taken from a payload.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.telemetry import event
from postrelay.queue import queries
from postrelay.queue.model import Job
from postrelay.queue.outcome import PermanentError

RETENTION_KIND = "cleanup_jobs"
DELETE_BATCH = 1000
MAX_BATCHES_PER_RUN = 1000  # a backlog larger than a million rows continues next hour

# Deletes one bounded batch older than `before`; returns how many rows it deleted.
DeleteBatch = Callable[[AsyncEngine, datetime, int], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class Cleaner:
    delete_batch: DeleteBatch
    default_days: float | None  # None: kept until an operator sets a window


AUDIT_TARGET = "audit"


async def _delete_done_batch(engine: AsyncEngine, before: datetime, batch: int) -> int:
    async with engine.begin() as conn:
        return await queries.job_delete_done_before(conn, before=before, batch=batch)


async def _delete_audit_batch(engine: AsyncEngine, before: datetime, batch: int) -> int:
    """One batch from the job audit, topped up from the cron audit, then the flow audit."""
    deleted = 0
    async with engine.begin() as conn:
        for delete in (queries.job_audit_delete_before, queries.cron_audit_delete_before,
                       queries.flow_audit_delete_before):
            deleted += await delete(conn, before=before, batch=batch - deleted)
            if deleted >= batch:
                break
    return deleted


def audit_cleaner(days: float | None, more: Sequence[DeleteBatch] = ()) -> Cleaner:
    """The `audit` target: aa_job_audit, aa_cron_audit and aa_flow_audit rows older than
    `days`, and what `more` deletes: the audits of the layers above (the suppression
    audit), under the same window. A batch is topped up from one audit after another, so
    it is short only when every audit is done."""
    batches = (_delete_audit_batch, *more)

    async def delete_batch(engine: AsyncEngine, before: datetime, batch: int) -> int:
        deleted = 0
        for delete in batches:
            deleted += await delete(engine, before, batch - deleted)
            if deleted >= batch:
                break
        return deleted

    return Cleaner(delete_batch, days)


async def delete_in_batches(engine: AsyncEngine, delete_batch: DeleteBatch,
                            before: datetime) -> int:
    """Delete batch after batch, each in its own short transaction, until one is short."""
    deleted = 0
    for _ in range(MAX_BATCHES_PER_RUN):
        n = await delete_batch(engine, before, DELETE_BATCH)
        deleted += n
        if n < DELETE_BATCH:
            break
    return deleted


async def delete_done_before(engine: AsyncEngine, before: datetime) -> int:
    return await delete_in_batches(engine, _delete_done_batch, before)


def cleanup_handler(
    engine: AsyncEngine, default_days: float, extra: Mapping[str, Cleaner] | None = None
) -> Callable[[Job], Awaitable[None]]:
    """The built-in handler for `cleanup_jobs`. Payload: `target` (default "jobs"), which
    picks one of the cleaners configured here. The window is always the target's configured
    one (the settings): a payload cannot shorten it, so the worst a payload can do is run
    a cleanup that was due within the hour anyway. Other payload fields, `retention_days`
    included, are ignored (logged). Only the system enqueues this kind (queue/reserved.py).
    """
    cleaners = {"jobs": Cleaner(_delete_done_batch, default_days), **(extra or {})}

    async def cleanup_jobs(job: Job) -> None:
        target = str(job.payload.get("target", "jobs"))
        cleaner = cleaners.get(target)
        if cleaner is None:
            raise PermanentError(f"unknown cleanup target {target!r}; known: {sorted(cleaners)}")
        if cleaner.default_days is None:
            event("postrelay.retention.kept", target=target, reason="no retention window set")
            return
        ignored = sorted(set(job.payload) - {"target"})
        if ignored:
            event("postrelay.retention.payload_ignored", logging.WARNING, job_id=str(job.id),
                  fields=ignored, reason="the window comes from the settings")
        async with engine.connect() as conn:  # rows carry the database's time, not ours
            before = await queries.database_now(conn) - timedelta(days=cleaner.default_days)
        deleted = await delete_in_batches(engine, cleaner.delete_batch, before)
        event("postrelay.retention.deleted", target=target, deleted=deleted,
              before=before.isoformat())

    return cleanup_jobs


__all__ = ["AUDIT_TARGET", "RETENTION_KIND", "Cleaner", "audit_cleaner", "cleanup_handler",
           "delete_done_before", "delete_in_batches"]
