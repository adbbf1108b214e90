"""Commit the sending marks of concurrent attempts together.

Every message commits its sending mark (mdm.aa_email_sending) before DATA. Done one by
one, that is a pool checkout, a statement and a flushed commit per message, and under load
the worker's handlers queue for connections. Here the attempts that arrive while a write is
in flight wait for the next one, so a busy worker commits dozens of marks per round trip
while an idle one still writes each at once. A row the database refuses fails only its own
attempt: a refused batch is written again row by row.

The writes go through one connection held for the worker's life (core/heldconn.py), with
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
from postrelay.core.service import ErrorBackoff, ServiceLoop
from postrelay.orchestrator import queries
from postrelay.orchestrator.queries import SendStart

MAX_BATCH = 500  # rows per statement: bounded work per write
# Under load, a write waits this long for more attempts before it starts: each write is a
# flushed commit, whose cost is the same for one row or fifty. An idle worker, whose last
# write carried one attempt, writes at once.
LINGER_SECS = 0.002


class SendingBatcher:
    """A write (`run_once`) whenever attempts are waiting; started by the first attempt."""

    def __init__(self, engine: AsyncEngine) -> None:
        # Each write is one statement, atomic on its own: the held connection autocommits.
        self._held = HeldConnection(engine, (text("SET plan_cache_mode = force_generic_plan"),))
        self._waiting: list[tuple[dict[str, Any], asyncio.Future[SendStart]]] = []
        # A write settles its attempts' futures, errors too: a round never fails, and the
        # backoff is there for a bug, not for the database.
        self._writer = ServiceLoop("sending", self.run_once, self._next_wait,
                                   backoff=ErrorBackoff(0.05, 2.0))
        self._busy = False  # the last write carried more than one attempt
        self.round_trips = 0

    async def begin(self, row: dict[str, Any], *, resend_unknown: bool) -> SendStart:
        """Run `email_send_begin_many` for this attempt's log row, together with whatever
        other attempts are waiting, and return this one's `SendStart`."""
        future: asyncio.Future[SendStart] = asyncio.get_running_loop().create_future()
        self._waiting.append(({**row, "resend_unknown": resend_unknown}, future))
        self._writer.wake.set()
        self._writer.start()
        return await future

    async def run_once(self) -> int:
        """Write the waiting attempts' marks (up to MAX_BATCH) and settle each attempt, with
        its SendStart or its error; returns how many were settled."""
        if not self._waiting:
            return 0
        if self._busy:  # let the attempts that are about to arrive join this write
            await asyncio.sleep(LINGER_SECS)
        batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
        self._busy = len(batch) > 1
        try:
            starts = await self._write([row for row, _ in batch])
        except (psycopg.DataError, psycopg.IntegrityError) as exc:
            if len(batch) == 1:
                _settle(batch[0][1], exc)
                return 1
            for row, future in batch:  # one refused row must not fail the others
                try:
                    _settle(future, (await self._write([row]))[row["job_id"]])
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
            _settle(future, starts[row["job_id"]])
        return len(batch)

    def _next_wait(self, _: int) -> float | None:
        """At once while attempts are waiting; else until the next one arrives."""
        return 0.0 if self._waiting else None

    async def _write(self, rows: list[dict[str, Any]]) -> dict[str, SendStart]:
        self.round_trips += 1
        async with self._held.use() as conn:
            return await queries.email_send_begin_many(conn, rows)

    async def close(self) -> None:
        """Stop writing and release the held connection; a later attempt starts both
        again. An attempt still waiting is cancelled."""
        await self._writer.stop()
        waiting, self._waiting = self._waiting, []
        for _, future in waiting:
            future.cancel()
        await self._held.close()


def _settle(future: asyncio.Future[SendStart], outcome: SendStart | BaseException) -> None:
    if future.done():  # its attempt was cancelled (timeout, shutdown) while waiting
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
