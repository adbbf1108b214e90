"""A connection checked out of the pool once and held for a loop's life.

A loop that talks to the database many times a second (the worker's claims, its outcome
writes) pays for every pool checkout: a greenlet switch in and out, the isolation level set
and reset, the reset on return. One connection, checked out once and used through its
psycopg connection in autocommit mode, pays none of that. A block that fails drops the
connection, so the next use starts on a fresh one.

Session settings given here are set once per connection, which is never handed back to
the pool. Behind a transaction pooler they are not set at all: there the held connection
is a client connection whose every transaction may run on another server connection, and
a session setting would stay behind on one that other clients use next. Whoever needs
them there sets them per transaction (queries.job_claim).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg
from sqlalchemy import TextClause
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from postrelay.core.db import behind_pooler
from postrelay.core.dbcall import psycopg_beneath


class HeldConnection:
    def __init__(self, engine: AsyncEngine, session: Sequence[TextClause] = ()) -> None:
        self._engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.pooled = behind_pooler(engine)  # behind a transaction pooler: no session state
        # SET statements run once on each new connection (none behind a pooler).
        self._session = () if self.pooled else tuple(session)
        self._conn: AsyncConnection | None = None
        self._driver: psycopg.AsyncConnection[Any] | None = None

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """The held connection's psycopg connection (opened on first use), in autocommit
        mode; dropped if the block raises."""
        if self._driver is None:
            conn = await self._engine.connect()
            try:
                for setting in self._session:
                    await conn.execute(setting)
                self._driver = await psycopg_beneath(conn)
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
    """Close without returning the connection to the pool: its session settings may differ
    from the pool's, and after a failure its state is unknown."""
    with contextlib.suppress(Exception):
        await conn.invalidate()
    with contextlib.suppress(Exception):
        await conn.close()
