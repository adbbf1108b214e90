"""Read what concurrent attempts must know before sending, in one round trip.

Before its message goes out, every attempt reads what earlier attempts of its job left and
which of its recipients are suppressed (`email_send_check_many`; orchestrator/attempts.py).
Done one by one, that is a pool checkout and a statement per message, and under load the
worker's handlers queue for connections. So the read is started for the jobs of a claim at
once, when they are claimed (`start`; claimed.py): by the time a slot runs one, its read
is usually back, where reading at that point put a round trip, and the wait for company,
in every message's path. An attempt that reaches its check without such a read reads then
(`check`): the attempts that arrive while a read is in flight wait for the next one, so a
busy worker reads for dozens of attempts per round trip while an idle one still reads for
each at once. A row the database refuses fails only its own attempt: a refused batch is
read again row by row.

The reads go through one connection held for the worker's life (core/heldconn.py), with
generic plans: the worker's pooled connections force custom plans for the sake of
job_finalize_many, and planning this statement afresh cost more server time than running
it for a batch of five. (Behind a transaction pooler nothing is prepared, so there is no
plan to keep, and the held connection sets nothing: heldconn.py.)
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.heldconn import HeldConnection
from postrelay.core.service import ErrorBackoff, ServiceLoop, sleep_until_woken
from postrelay.orchestrator import queries
from postrelay.orchestrator.attempts import SendCheck

MAX_BATCH = 500  # rows per statement: bounded work per read
# Under load, a read waits this long for more attempts before it starts: a round trip
# costs the worker and the server more than a row in it. It starts at once when half the
# worker's slots wait on it: those slots are idle, and at the default concurrency the wait
# was about half of a message's time. An idle worker, whose last read carried one attempt,
# reads at once.
LINGER_SECS = 0.005
_READ = ("job_id", "tenant_id", "recipients")  # what the read needs of a log row


class SendCheckBatcher:
    """A read (`run_once`) whenever attempts are waiting; started by the first attempt."""

    def __init__(self, engine: AsyncEngine, *, concurrency: int = 10) -> None:
        """`concurrency`: the worker's slots, of which half waiting end the wait."""
        # Each read is one statement: the held connection autocommits.
        self._held = HeldConnection(engine, (text("SET plan_cache_mode = force_generic_plan"),))
        self._waiting: list[tuple[dict[str, Any], asyncio.Future[SendCheck]]] = []
        # A read settles its attempts' futures, errors too: a round never fails, and the
        # backoff is there for a bug, not for the database.
        self._reader = ServiceLoop("send-check", self.run_once, self._next_wait,
                                   backoff=ErrorBackoff(0.05, 2.0))
        self._busy = False  # the last read carried more than one attempt
        self._enough = max(2, concurrency // 2)  # attempts waiting that end the wait
        self._enough_waiting = asyncio.Event()
        self.round_trips = 0

    def start(self, rows: list[dict[str, Any]]) -> list[asyncio.Future[SendCheck]]:
        """Start the read for these rows now, in one round trip (their batch is whole: no
        wait for company); each row's SendCheck, to await when its attempt needs it."""
        futures = [self._enqueue(row) for row in rows]
        self._enough_waiting.set()
        return futures

    async def check(self, row: dict[str, Any]) -> SendCheck:
        """Run `email_send_check_many` for this attempt's log row, together with whatever
        other attempts are waiting, and return this one's `SendCheck`."""
        future = self._enqueue(row)
        if len(self._waiting) >= self._enough:
            self._enough_waiting.set()
        return await future

    def _enqueue(self, row: dict[str, Any]) -> asyncio.Future[SendCheck]:
        future: asyncio.Future[SendCheck] = asyncio.get_running_loop().create_future()
        self._waiting.append(({k: row[k] for k in _READ}, future))
        self._reader.wake.set()
        self._reader.start()
        return future

    async def run_once(self) -> int:
        """Read for the waiting attempts (up to MAX_BATCH) and settle each attempt, with its
        SendCheck or its error; returns how many were settled."""
        if not self._waiting:
            return 0
        if self._busy and len(self._waiting) < self._enough:
            # Let the attempts that are about to arrive join this read.
            await sleep_until_woken(self._enough_waiting, LINGER_SECS)
        self._enough_waiting.clear()
        batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
        self._busy = len(batch) > 1
        try:
            checks = await self._read([row for row, _ in batch])
        except (psycopg.DataError, psycopg.IntegrityError) as exc:
            if len(batch) == 1:
                _settle(batch[0][1], exc)
                return 1
            for row, future in batch:  # one refused row must not fail the others
                try:
                    _settle(future, (await self._read([row]))[row["job_id"]])
                except Exception as row_exc:
                    _settle(future, row_exc)
            return len(batch)
        except Exception as exc:  # e.g. the connection was lost: every attempt retries
            for _, future in batch:
                _settle(future, exc)
            return len(batch)
        except BaseException:  # the worker is stopping
            for _, future in batch:
                future.cancel()
            raise
        for row, future in batch:
            _settle(future, checks[row["job_id"]])
        return len(batch)

    def _next_wait(self, _: int) -> float | None:
        """At once while attempts are waiting; else until the next one arrives."""
        return 0.0 if self._waiting else None

    async def _read(self, rows: list[dict[str, Any]]) -> dict[str, SendCheck]:
        self.round_trips += 1
        async with self._held.use() as conn:
            return await queries.email_send_check_many(conn, rows)

    async def close(self) -> None:
        """Stop reading and release the held connection; a later attempt starts both
        again. An attempt still waiting is cancelled."""
        await self._reader.stop()
        waiting, self._waiting = self._waiting, []
        for _, future in waiting:
            future.cancel()
        await self._held.close()


def _settle(future: asyncio.Future[SendCheck], outcome: SendCheck | BaseException) -> None:
    if future.done():  # its attempt was cancelled (timeout, shutdown) while waiting
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
