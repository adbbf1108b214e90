"""Group commit for the inbound receiver: the reports of messages that arrive while one
transaction is being committed are recorded together in the next one.

    group = GroupCommit(async_engine, policy)
    done = await group.record(reports)   # returns once these reports are committed

A commit waits for its WAL flush, which costs more than everything else a DSN needs; one
commit for the ten messages that came in meanwhile makes ten times fewer of them. Each
message is still answered only after its own reports are committed, and one message whose
reports cannot be recorded does not fail the others: that batch is retried a message at a
time.

The transactions run on the receiver's own event loop (an async engine): no thread to hand
each batch to and back, and no second thread contending with the SMTP sessions for the GIL
at every round trip.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.dbcall import psycopg_beneath
from postrelay.core.telemetry import event
from postrelay.orchestrator.feedback.model import Feedback, Recorded, SuppressionPolicy
from postrelay.orchestrator.feedback.record import record_many_async

MAX_MESSAGES = 100
# Transactions in flight at most. One at a time is the rule: whatever arrives while it runs
# waits for the next, so batches grow with the load and each DSN costs the receiver and the
# database less (a transaction's statements and commit cost about the same for one message
# as for ten). Another starts beside it only when a full batch waits, so the database's
# other cores are used once one transaction can no longer keep up.
IN_FLIGHT = 3


class GroupCommit:
    def __init__(self, engine: AsyncEngine, policy: SuppressionPolicy,
                 max_messages: int = MAX_MESSAGES, in_flight: int = IN_FLIGHT) -> None:
        self.engine = engine
        self.policy = policy
        self.max_messages = max_messages
        self.in_flight = in_flight
        self._waiting: list[tuple[list[Feedback], asyncio.Future[list[Recorded]]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def record(self, reports: Sequence[Feedback]) -> list[Recorded]:
        """Record one message's reports; raises what recording it alone raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Recorded]] = loop.create_future()
        self._waiting.append((list(reports), future))
        if not self._tasks or (len(self._tasks) < self.in_flight
                               and len(self._waiting) >= self.max_messages):
            task = loop.create_task(self._run())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _run(self) -> None:
        # What arrives while the transactions in flight commit waits for the next one.
        while self._waiting:
            batch = self._waiting[:self.max_messages]
            del self._waiting[:len(batch)]
            try:
                results = await self._commit([r for r, _ in batch])
            except Exception as exc:
                event("postrelay.inbound.batch_failed", logging.WARNING,
                      messages=len(batch), error=repr(exc))
                await self._one_by_one(batch)
                continue
            for (_, future), done in zip(batch, results, strict=True):
                if not future.done():  # the session may be gone
                    future.set_result(done)

    async def _one_by_one(self, batch: list[tuple[list[Feedback],
                                                  asyncio.Future[list[Recorded]]]]) -> None:
        for reports, future in batch:
            try:
                (done,) = await self._commit([reports])
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
                continue
            if not future.done():
                future.set_result(done)

    async def _commit(self, messages: list[list[Feedback]]) -> list[list[Recorded]]:
        reports = [r for reports in messages for r in reports]
        async with self.engine.connect() as conn:
            # The statements run on the psycopg connection beneath: SQLAlchemy's async layer
            # costs about as much CPU per statement as the driver does.
            raw = await psycopg_beneath(conn)
            try:
                async with raw.transaction():
                    flat = await record_many_async(raw, reports, self.policy)
            except BaseException:
                if raw.closed or raw.broken:  # lost: the pool must not hand it out again
                    await conn.invalidate()
                raise
        results, start = [], 0
        for reports in messages:
            results.append(flat[start:start + len(reports)])
            start += len(reports)
        return results
