"""Records what `postrelay inbound` stored in its inbox (aa_feedback_inbox), on the
receiver's event loop: up to 100 messages a transaction, oldest first, taken out of the inbox
(deleted), parsed and their reports recorded (record_many_async), all in one commit.

    processor = InboxProcessor(async_engine, read, policy)
    processor.start()      # on the event loop that runs it
    processor.wake()       # after each inbox commit; it also polls every POLL_SECS
    await processor.stop() # the current batch finishes, or is abandoned (its rows stay)

While inbox commits keep coming, a batch waits (DEFER_SECS at most): the SMTP sessions have
the loop to themselves, and the batches that follow are full. Once none has come for
QUIET_SECS it starts at once.

The commit waits for its WAL flush. It need not (were it lost, the rows would still be in
the inbox and be recorded again, and recording the same report twice changes nothing), but
left unflushed a batch's WAL is flushed by the next inbox write, whose 250s wait. Several
processes may share the inbox (FOR UPDATE SKIP LOCKED). Behind a backlog a second batch is
taken and parsed while the first records; batches still record and commit one at a time.
A batch that fails is retried a message at a time; a message that fails on its own is
tried again after a backoff, and after MAX_ATTEMPTS it is recorded as an `unparsed` report
that carries the error, and deleted.

Each batch it takes is reported to the receiver's intake (intake.py), which holds new mail
while the processor lags.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.conflicts import in_transaction_async
from postrelay.core.dbcall import psycopg_sql
from postrelay.core.telemetry import event
from postrelay.orchestrator.feedback.groupcommit import held_psycopg
from postrelay.orchestrator.feedback.intake import Intake
from postrelay.orchestrator.feedback.model import Feedback, SuppressionPolicy
from postrelay.orchestrator.feedback.queries import FEEDBACK_SQL
from postrelay.orchestrator.feedback.record import record_many_async

BATCH = 100
POLL_SECS = 2.0  # rows left by a crash, by another process, or waiting out a backoff
MAX_ATTEMPTS = 5
RETRY_SECS = 1.0  # the first backoff; doubled at each failure
# After a wake, the batch waits while mail keeps coming: until no inbox commit has come for
# QUIET_SECS (the senders paused or are done), DEFER_SECS at most. Meanwhile the SMTP
# sessions have the loop to themselves and are answered sooner, and the batches that follow
# are full: a batch costs the receiver and the database about as much for ten DSNs as for
# one. Recording happens after the 250, so the wait delays no sender.
QUIET_SECS = 0.005
DEFER_SECS = 0.2
STOP_SECS = 5.0  # how long stop() lets the current batch finish before abandoning it
# Smaller messages are parsed on the event loop: handing a DSN of a few kB to a thread costs
# about what parsing it does, and the GIL lets no two parses run at once anyway.
INLINE_PARSE_BYTES = 256 * 1024
HEAD_CHARS = 16 * 1024  # of a message given up on, the start kept in its `unparsed` report

Read = Callable[[list[str], bytes], list[Feedback]]
Row = Any  # a named tuple of feedback_inbox_take: id, envelope_to, raw, attempts


class InboxProcessor:
    def __init__(self, engine: AsyncEngine, read: Read, policy: SuppressionPolicy,
                 batch: int = BATCH, poll_secs: float = POLL_SECS,
                 max_attempts: int = MAX_ATTEMPTS, retry_secs: float = RETRY_SECS,
                 quiet_secs: float = QUIET_SECS, defer_secs: float = DEFER_SECS,
                 intake: Intake | None = None) -> None:
        self.engine = engine
        self.intake = intake if intake is not None else Intake()  # what it takes is counted
        self.read = read
        self.policy = policy
        self.batch = batch
        self.poll_secs = poll_secs
        self.max_attempts = max_attempts
        self.retry_secs = retry_secs
        self.quiet_secs = quiet_secs
        self.defer_secs = defer_secs
        self.recorded = 0  # messages recorded (or given up on) by this processor
        self._wake = asyncio.Event()
        self._woken_at = 0.0  # time.monotonic() of the last wake
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._helper: asyncio.Task[None] | None = None  # a second batch, while backlogged
        self._turn = asyncio.Lock()  # held by the batch recording and committing

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    def wake(self) -> None:
        self._woken_at = time.monotonic()
        self._wake.set()

    async def stop(self, timeout: float = STOP_SECS) -> None:
        """Let the current batch finish (within `timeout`), else abandon it: a transaction
        rolled back leaves its rows in the inbox."""
        self._stopping = True
        self._wake.set()
        tasks = [t for t in (self._task, self._helper) if t is not None]
        self._task = self._helper = None
        if not tasks:
            return
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.gather(*tasks), timeout)

    async def _run(self) -> None:
        while not self._stopping:
            self._wake.clear()  # a wake during the batch below makes the next one at once
            try:
                took = await self.process_once()
            except Exception as exc:  # the database: rows stay, tried again at the next poll
                event("postrelay.inbound.inbox_failed", logging.WARNING, error=repr(exc))
                took = 0
            if took >= self.batch or self._stopping:
                if not self._stopping and (self._helper is None or self._helper.done()):
                    self._helper = asyncio.get_running_loop().create_task(self._backlog())
                continue  # more may be waiting
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_secs)
            if self._wake.is_set():
                await self._while_arriving()

    async def _while_arriving(self) -> None:
        """Until no wake has come for `quiet_secs`, or `defer_secs` after the first. One
        timer at a time, not one per wake: under load the inbox commits come every
        millisecond or so."""
        deadline = time.monotonic() + self.defer_secs
        while not self._stopping:
            now = time.monotonic()
            until = min(self._woken_at + self.quiet_secs, deadline)
            if now >= until:
                return
            await asyncio.sleep(until - now)

    async def _backlog(self) -> None:
        """Batches beside `_run`'s while they come back full: one is read and parsed on the
        loop while the other's statements run (one alone leaves the loop idle meanwhile)."""
        while not self._stopping:
            try:
                if await self.process_once() < self.batch:
                    return
            except Exception as exc:  # as in _run: the rows stay for the next poll
                event("postrelay.inbound.inbox_failed", logging.WARNING, error=repr(exc))
                return

    async def process_once(self) -> int:
        """Record one batch; how many messages it took (0: none was ready)."""
        rows: list[Row] = []
        try:
            await self._take_and_record(rows, "feedback_inbox_take", {"limit": self.batch},
                                        batch=True)
        except Exception as exc:
            if not rows:
                raise
            event("postrelay.inbound.batch_failed", logging.WARNING, messages=len(rows),
                  error=repr(exc))
            for row in rows:
                await self._one(row)
        self.recorded += len(rows)
        return len(rows)

    async def _take_and_record(self, rows: list[Row], take: str, params: dict[str, Any],
                               batch: bool = False) -> None:
        """One transaction: take rows out of the inbox (into `rows`), read them, record
        their reports; a `batch` is reported to the intake as soon as it is taken. Two
        batches may be read at once, but they record and commit one at a time: each one's
        statements see what the other committed (a soft bounce counts those before it), as
        when one batch runs at a time. A transaction that loses to a concurrent one (a
        deadlock with another receiver or a webhook) runs again: the message is not to
        blame, and a failure would count against it. The intake hears of a row once
        however often it is taken: an attempt rolled back put its rows back."""
        reported = [0]  # rows the intake has heard of, over the attempts
        await in_transaction_async(lambda: self._attempt(rows, take, params, batch, reported),
                                   what="feedback.inbox")

    async def _attempt(self, rows: list[Row], take: str, params: dict[str, Any],
                       batch: bool, reported: list[int]) -> None:
        turn = False
        try:
            async with held_psycopg(self.engine) as conn, conn.transaction():
                # Oldest first within the batch too: a DELETE returns its rows in no order.
                rows[:] = sorted(await _fetch(conn, take, params), key=lambda row: row.id)
                if batch:
                    self.intake.taken(max(0, len(rows) - reported[0]),
                                      drained=len(rows) < self.batch)
                    reported[0] = max(reported[0], len(rows))
                if not rows:
                    return
                reports = []
                for row in rows:
                    raw = bytes(row.raw)
                    if len(raw) <= INLINE_PARSE_BYTES:
                        reports += self.read(list(row.envelope_to), raw)
                        await asyncio.sleep(0)  # the SMTP sessions go on between two parses
                    else:
                        reports += await asyncio.to_thread(self.read, list(row.envelope_to),
                                                           raw)
                await self._turn.acquire()
                turn = True
                await record_many_async(conn, reports, self.policy)
        finally:
            if turn:  # after the commit
                self._turn.release()

    async def _one(self, row: Row) -> None:
        try:
            # Takes nothing if recorded meanwhile, or if another process holds it.
            await self._take_and_record([], "feedback_inbox_take_one", {"id": row.id})
            return
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        try:
            await self._failed(row, error)
        except Exception as exc:  # the database again: the row stays as it was
            event("postrelay.inbound.inbox_failed", logging.ERROR, inbox_id=str(row.id),
                  error=repr(exc))

    async def _failed(self, row: Row, error: str) -> None:
        """Count the failure against the message, or give it up: a transaction that loses
        to a concurrent one runs again, as a recording does."""
        await in_transaction_async(lambda: self._count_failure(row, error),
                                   what="feedback.inbox_failed")

    async def _count_failure(self, row: Row, error: str) -> None:
        attempts = row.attempts + 1
        async with held_psycopg(self.engine) as conn, conn.transaction():
            if attempts < self.max_attempts:
                event("postrelay.inbound.message_failed", logging.WARNING,
                      inbox_id=str(row.id), attempts=attempts, error=error)
                await _fetch(conn, "feedback_inbox_retry_later", {
                    "id": row.id, "error": error[:2000],
                    "delay_secs": self.retry_secs * 2 ** (attempts - 1)})
                return
            event("postrelay.inbound.message_given_up", logging.ERROR, inbox_id=str(row.id),
                  attempts=attempts, error=error)
            if await _fetch(conn, "feedback_inbox_take_one", {"id": row.id}):
                await record_many_async(conn, [given_up(row, attempts, error)], self.policy)


def given_up(row: Row, attempts: int, error: str) -> Feedback:
    """The `unparsed` report that keeps a message that could not be recorded: the error,
    its envelope and the start of the message, for an operator."""
    raw = bytes(row.raw)
    head = raw[:HEAD_CHARS].decode("utf-8", "replace").replace("\x00", "")  # jsonb: no NUL
    return Feedback(kind="unparsed", source="mail", source_event_id=f"inbox:{row.id}",
                    detail={"reason": f"not recorded after {attempts} attempts: {error}",
                            "envelope_to": list(row.envelope_to), "bytes": len(raw),
                            "head": head})


async def _fetch(conn: psycopg.AsyncConnection[Any], name: str,
                 params: dict[str, Any]) -> list[Row]:
    cursor = conn.cursor(row_factory=namedtuple_row)
    # Rows in binary: a message comes back as its bytes, not as twice as many hex digits
    # for the server to write and the driver to read.
    await cursor.execute(psycopg_sql(FEEDBACK_SQL[name]), params, binary=True)
    return await cursor.fetchall() if cursor.description else []
