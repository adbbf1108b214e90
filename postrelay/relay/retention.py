"""Outbox retention: handled events are deleted after a window (default 7 days) by the
`cleanup_jobs` job of the built-in cron entry `postrelay.outbox-retention`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.relay.queries import OUTBOX_SQL
from postrelay.relay.webhooks.route import DISPATCH_KIND

OUTBOX_TARGET = "outbox"
EVENT_READERS = (DISPATCH_KIND,)  # the relay's job kinds that read their event when run


async def delete_handled_batch(engine: AsyncEngine, before: datetime, batch: int, *,
                               readers: Sequence[str] = EVENT_READERS) -> int:
    """One batch of handled events older than `before`, but those with a job of a kind in
    `readers` (the kinds whose jobs read their event when they run) still to run: the
    webhook deliveries, and what the packages above add (a split email route's messages);
    and those with an ordered route's job still to run, which their aggregate's later
    events wait for (relay/ordering.py)."""
    async with engine.begin() as conn:
        result = await conn.execute(OUTBOX_SQL["outbox_delete_handled_before"],
                                    {"before": before, "batch": batch, "readers": list(readers)})
    return result.rowcount
