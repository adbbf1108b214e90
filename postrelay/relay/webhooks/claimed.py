"""Deliveries' reads started when their jobs are claimed: one round trip per claim.

Each `outbox_dispatch` run needs its event and its endpoint (`webhook_delivery_load`).
Read run by run, that was a pool checkout, a statement and the pool's ROLLBACK on return
for every delivery; at the worker's concurrency the pool overflowed too, and connections
were opened and closed all the time. So the worker tells the handler of each claim's jobs
(the queue's `on_claim` hook), and `claimed` starts one read of all their rows
(`webhook_delivery_load_many`) on the worker's event loop, through one connection held for
the worker's life. A run that starts within EARLY_SECS of its claim takes its row from
that read (`take`); otherwise (no read was started for it, the read is stale, its payload
is malformed, or the read failed) it reads on its own, exactly as before.

    claimed = ClaimedDeliveries(engine, parse=parse_payload)
    claimed.claimed(jobs)              # the claim hook
    row = await claimed.take(job)      # in the run: the row, or None
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.rows import dict_row
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core import jsontext
from postrelay.core.dbcall import psycopg_sql
from postrelay.core.heldconn import HeldConnection
from postrelay.core.telemetry import event as log_event
from postrelay.queue import Job, PermanentError
from postrelay.relay.webhooks.endpoints import WEBHOOK_SQL

# How long a read started at the claim serves its run. A row tells the run whether the
# endpoint still exists and is enabled, and whether the event was delivered already; the
# run's own read is as old by the time its POST goes out, give or take a round trip. One
# second keeps the claim read's age of the same order (a claim's runs start within
# milliseconds unless every slot is busy), while a run held longer (slots full, jobs held
# ahead) reads again and so sees an endpoint disabled or removed meanwhile. The email
# handler's read before sending uses the same window (orchestrator/claimed.py).
EARLY_SECS = 1.0
Row = Mapping[str, Any]
_Entry = tuple["asyncio.Future[Row | None]", float]


class ClaimedDeliveries:
    """`parse(job)` returns the job's (event id, endpoint id), or raises PermanentError.
    `clock` is monotonic seconds (tests pass their own). `round_trips` counts the reads."""

    def __init__(self, engine: AsyncEngine, parse: Callable[[Job], tuple[UUID, UUID]], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        # Generic plans, as for the email handler's read (orchestrator/sending.py): the
        # worker's pooled connections force custom plans, which would plan every read anew.
        self._held = HeldConnection(engine, (text("SET plan_cache_mode = force_generic_plan"),))
        self._lock = asyncio.Lock()  # one statement at a time on the held connection
        self.parse = parse
        self.clock = clock
        # By (job id, claim moment): the claim an entry belongs to, and when it was made.
        self._ready: dict[tuple[UUID, datetime], _Entry] = {}
        self._reads: set[asyncio.Task[None]] = set()
        self.round_trips = 0

    def claimed(self, jobs: Sequence[Job]) -> None:
        """The claim hook: start the read of these jobs' rows, without waiting for it."""
        loop = asyncio.get_running_loop()  # the worker's; outside a loop, no head start
        now = self.clock()
        self._drop_older_than(now - EARLY_SECS)
        pairs: list[dict[str, Any]] = []
        futures: dict[str, asyncio.Future[Row | None]] = {}
        for job in jobs:
            try:
                event_id, endpoint_id = self.parse(job)
            except PermanentError:
                continue  # its run fails it, with the reason
            future: asyncio.Future[Row | None] = loop.create_future()
            self._ready[(job.id, job.claimed_at)] = (future, now)
            futures[str(job.id)] = future
            pairs.append({"job_id": job.id, "event_id": event_id, "endpoint_id": endpoint_id})
        if not pairs:
            return
        task = loop.create_task(self._read(pairs, futures))
        self._reads.add(task)
        task.add_done_callback(self._reads.discard)

    async def take(self, job: Job) -> Row | None:
        """This run's row, read at its claim, if that is recent enough; None: read now."""
        entry = self._ready.pop((job.id, job.claimed_at), None)
        if entry is None:
            return None
        future, made = entry
        if self.clock() - made >= EARLY_SECS:
            future.cancel()
            return None
        return await future

    async def close(self) -> None:
        """Stop the reads in flight and release the held connection (the worker has
        stopped: no run waits on them)."""
        reads = list(self._reads)
        for task in reads:
            task.cancel()
        await asyncio.gather(*reads, return_exceptions=True)
        for future, _ in self._ready.values():
            future.cancel()
        self._ready.clear()
        await self._held.close()

    async def _read(self, pairs: list[dict[str, Any]],
                    futures: dict[str, asyncio.Future[Row | None]]) -> None:
        rows: list[dict[str, Any]] = []
        try:
            async with self._lock, self._held.use() as conn:
                self.round_trips += 1
                cursor = conn.cursor(row_factory=dict_row)
                await cursor.execute(psycopg_sql(WEBHOOK_SQL["webhook_delivery_load_many"]),
                                     {"pairs": jsontext.encode_rows(pairs)})
                rows = await cursor.fetchall()
        except Exception as exc:  # only a head start lost: each run reads on its own
            log_event("postrelay.webhook.claim_read_failed", logging.WARNING,
                      jobs=len(pairs), error=repr(exc))
        except BaseException:  # closing
            for future in futures.values():
                future.cancel()
            raise
        found = {str(row.pop("job_id")): row for row in rows}
        for job_id, future in futures.items():
            if not future.done():  # its run gave up waiting (timeout, stop), or went stale
                future.set_result(found.get(job_id))

    def _drop_older_than(self, moment: float) -> None:
        """Oldest first: entries of jobs that never ran here (handed back at a stop, or
        held too long) or whose run is yet to start and will read on its own anyway."""
        while self._ready:
            key, (future, made) = next(iter(self._ready.items()))
            if made >= moment:
                return
            del self._ready[key]
            future.cancel()
