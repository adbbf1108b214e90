"""The claim loop's own connection, held for the worker's life.

A worker woken by NOTIFY claims at once; checking a connection out of the pool for every
claim adds a pool round and greenlet switches to the pickup latency of every job. One
connection, checked out once and used through its psycopg connection directly, avoids
both. A claim that fails drops the connection, so the next one starts on a fresh one.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

# The claim connection's own session settings:
# - plan_cache_mode = auto: the worker's engine forces custom plans for the sake of
#   job_finalize_many; the claim is planned well generically and runs on every wake-up.
# - synchronous_commit = off: a claim does not wait for its WAL to reach disk. Should the
#   server crash before that, the claim is forgotten and the job is pending again, to run
#   once more, as after any crash mid-job; any later durable commit (the job's outcome, an
#   email's `sending` row) flushes the claim with it. The flush was 0.2-0.3 ms of every
#   pickup's latency.
# - enable_sort and enable_bitmapscan off: the claim always walks ix_job_dispatch in
#   (priority, available_at) order and stops at LIMIT. When a burst of jobs arrives faster
#   than autovacuum analyzes the table, stale statistics promise a handful of pending rows
#   and the planner picks a bitmap scan that sorts every pending row on every claim: with
#   8,000 queued jobs each claim cost 1-5 ms of server CPU instead of 0.5 ms.
_SESSION = (
    text("SET plan_cache_mode = auto"),
    text("SET synchronous_commit = off"),
    text("SET enable_sort = off"),
    text("SET enable_bitmapscan = off"),
)


class ClaimConnection:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._conn: AsyncConnection | None = None
        self._driver: psycopg.AsyncConnection[Any] | None = None

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """The held connection's psycopg connection (opened on first use), in autocommit
        mode; dropped if the block raises."""
        if self._driver is None:
            conn = await self._engine.connect()
            try:
                for setting in _SESSION:
                    await conn.execute(setting)
                self._driver = (await conn.get_raw_connection()).driver_connection
            except BaseException:
                await _discard(conn)
                raise
            self._conn = conn
        try:
            yield self._driver
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        conn, self._conn, self._driver = self._conn, None, None
        if conn is not None:
            await _discard(conn)


async def _discard(conn: AsyncConnection) -> None:
    """Close without returning the connection to the pool: its session settings differ
    from the pool's, and after a failure its state is unknown."""
    with contextlib.suppress(Exception):
        await conn.invalidate()
    with contextlib.suppress(Exception):
        await conn.close()
