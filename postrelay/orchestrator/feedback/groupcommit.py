"""Group commit for the inbound receiver: what arrives while one transaction is being
committed is committed together in the next one. `Batches` is the mechanism; the receiver
stores raw messages with it (spool.InboxSpool).

    done = await batches.submit(item)   # returns once this item is committed

A commit waits for its WAL flush, which costs more than everything else a DSN needs; one
commit for the ten messages that came in meanwhile makes ten times fewer of them. Each
message is still answered only after its own commit, and one message that cannot be
committed does not fail the others: that batch is retried a message at a time.

The transactions run on the receiver's own event loop (an async engine): no thread to hand
each batch to and back, and no second thread contending with the SMTP sessions for the GIL
at every round trip.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

import psycopg
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.dbcall import psycopg_beneath
from postrelay.core.telemetry import event

MAX_MESSAGES = 100
# Transactions in flight at most. One at a time is the rule: whatever arrives while it runs
# waits for the next, so batches grow with the load and each DSN costs the receiver and the
# database less (a transaction's statements and commit cost about the same for one message
# as for ten). Another starts beside it only when a full batch waits, so the database's
# other cores are used once one transaction can no longer keep up.
IN_FLIGHT = 3
# With `gather_woken`, a busy receiver (its last batch held more than one item) takes each
# batch one timer tick late: after the sessions that the loop's last poll woke (a DATA that
# arrived) have run and submitted, so their messages join this commit instead of paying for
# one of their own. A bare yield (`sleep(0)`) would resume ahead of them: they were woken
# after it was scheduled. uvloop fires any delay under half a millisecond at its next turn,
# asyncio's loop at once. An idle receiver, whose last batch held one item, commits at once.
TIMER_TICK_SECS = 1e-6
T = TypeVar("T")
R = TypeVar("R")


class Batches(Generic[T, R]):
    """Items submitted while a transaction commits are committed together in the next one;
    `_commit` (a subclass's) commits one batch and returns each item's result, in order."""

    def __init__(self, max_messages: int = MAX_MESSAGES, in_flight: int = IN_FLIGHT,
                 gather_woken: bool = False) -> None:
        self.max_messages = max_messages
        self.in_flight = in_flight
        self.gather_woken = gather_woken
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._busy = False  # the last batch held more than one item

    async def submit(self, item: T) -> R:
        """Commit `item` with whatever else is waiting; raises what committing it alone
        raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._waiting.append((item, future))
        if not self._tasks or (len(self._tasks) < self.in_flight
                               and len(self._waiting) >= self.max_messages):
            task = loop.create_task(self._run())
            self._tasks.add(task)
        return await future

    async def _run(self) -> None:
        # What arrives while the transactions in flight commit waits for the next one.
        try:
            while self._waiting:
                if self.gather_woken and self._busy and len(self._waiting) < self.max_messages:
                    await asyncio.sleep(TIMER_TICK_SECS)
                batch = self._waiting[:self.max_messages]
                del self._waiting[:len(batch)]
                self._busy = len(batch) > 1
                try:
                    results = await self._commit([item for item, _ in batch])
                except Exception as exc:
                    event("postrelay.inbound.batch_failed", logging.WARNING,
                          messages=len(batch), error=repr(exc))
                    await self._one_by_one(batch)
                    continue
                for (_, future), done in zip(batch, results, strict=True):
                    if not future.done():  # the session may be gone
                        future.set_result(done)
        finally:
            # Out of the set in the same step that found nothing waiting, not in a done
            # callback: a caller woken by the last batch runs before such a callback, and
            # its next item, seeing this task still listed, would wait for it forever.
            self._tasks.discard(asyncio.current_task())

    async def _one_by_one(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        for item, future in batch:
            try:
                (done,) = await self._commit([item])
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
                continue
            if not future.done():
                future.set_result(done)

    async def _commit(self, items: list[T]) -> list[R]:
        raise NotImplementedError


@asynccontextmanager
async def held_psycopg(engine: AsyncEngine) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A pooled connection's psycopg connection beneath (SQLAlchemy's async layer costs
    about as much CPU per statement as the driver does). A connection found lost is
    invalidated, and the pool's others replaced: a lost connection rarely goes alone (a
    restart, a failover, an administrator), and the retry must not meet another."""
    async with engine.connect() as conn:
        raw = await psycopg_beneath(conn)
        try:
            yield raw
        except BaseException:
            if raw.closed or raw.broken:
                await conn.invalidate()
                await engine.dispose(close=False)
            raise
