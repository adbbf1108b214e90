"""Run one piece of database logic on whatever the caller holds.

Writes that join the caller's transaction (`enqueue`, `emit`) accept a sync or async
SQLAlchemy Connection or Session, or a plain psycopg (3) connection. The logic is written
once, as a generator that yields `(statement, params)` (or a `Copy`) and receives the rows
(for a statement that returns none, the number of rows it wrote); `drive` runs it
synchronously, or returns an awaitable when the caller holds an async connection.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Generator, Sequence
from typing import Any, TypeVar

import psycopg
from sqlalchemy import Connection, Row, TextClause
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.sql import Executable

from postrelay.core.bulkcopy import Copy, copy_rows, copy_rows_async

T = TypeVar("T")
Rows = Sequence[Row[Any]]
# A step yields a statement and its parameters (it receives the rows, or the row count of a
# statement that returns none) or a Copy.
Steps = Generator[tuple[Executable, Any] | Copy, Rows | int | None, T]
AnyConnection = (
    Connection | Session | AsyncConnection | AsyncSession
    | psycopg.Connection[Any] | psycopg.AsyncConnection[Any]
)
_DIALECT = psycopg_dialect()
_PLACEHOLDER = re.compile(r"(?<!%)%\((\w+)\)s")


def is_async(conn: AnyConnection) -> bool:
    return isinstance(conn, AsyncConnection | AsyncSession | psycopg.AsyncConnection)


def drive(conn: AnyConnection, steps: Steps[T]) -> T | Awaitable[T]:
    if isinstance(conn, AsyncConnection | AsyncSession):
        return _drive_async(conn, steps)
    if isinstance(conn, Connection | Session):
        return _drive_sync(conn, steps)
    if isinstance(conn, psycopg.AsyncConnection):
        return _drive_psycopg_async(conn, steps)
    if isinstance(conn, psycopg.Connection):
        return _drive_psycopg(conn, steps)
    raise TypeError(
        "conn: expected a SQLAlchemy Connection or Session (sync or async) or a psycopg "
        f"connection, got {type(conn)!r}"
    )


@functools.cache
def psycopg_sql(statement: TextClause, binary: bool = False) -> str:
    """The statement in psycopg's `%(name)s` style, compiled once per statement; with
    `binary`, every parameter is sent in binary (`%(name)b`)."""
    sql = str(statement.compile(dialect=_DIALECT))
    return _PLACEHOLDER.sub(r"%(\1)b", sql) if binary else sql


def _drive_psycopg(conn: psycopg.Connection[Any], steps: Steps[T]) -> T:
    try:
        step = next(steps)
        while True:
            if isinstance(step, Copy):
                step = steps.send([] if copy_rows(conn, step) else None)  # type: ignore[arg-type]
                continue
            statement, params = step
            cursor = conn.execute(psycopg_sql(statement), params)  # type: ignore[arg-type]
            rows = cursor.fetchall() if cursor.description else cursor.rowcount
            step = steps.send(rows)  # type: ignore[arg-type]
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def _drive_psycopg_async(conn: psycopg.AsyncConnection[Any], steps: Steps[T]) -> T:
    try:
        step = next(steps)
        while True:
            if isinstance(step, Copy):
                copied = await copy_rows_async(conn, step)
                step = steps.send([] if copied else None)  # type: ignore[arg-type]
                continue
            statement, params = step
            cursor = await conn.execute(psycopg_sql(statement), params)  # type: ignore[arg-type]
            rows = await cursor.fetchall() if cursor.description else cursor.rowcount
            step = steps.send(rows)  # type: ignore[arg-type]
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _drive_sync(conn: Connection | Session, steps: Steps[T]) -> T:
    try:
        step = next(steps)
        while True:
            if isinstance(step, Copy):
                # COPY has no SQLAlchemy API: it runs on the psycopg connection beneath, in
                # the transaction an earlier step of the same logic began.
                bound = conn.connection() if isinstance(conn, Session) else conn
                copied = copy_rows(bound.connection.driver_connection, step)
                step = steps.send([] if copied else None)  # type: ignore[arg-type]
                continue
            statement, params = step
            # A Connection takes the statement as the driver's SQL: SQLAlchemy's compiled
            # path costs a quarter more CPU per statement; its events and echo still see it.
            # A Session keeps its own execute, which flushes pending ORM objects first.
            result = (conn.exec_driver_sql(psycopg_sql(statement), params)
                      if isinstance(conn, Connection) else conn.execute(statement, params))
            rows = result.fetchall() if result.returns_rows else result.rowcount
            step = steps.send(rows)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def _drive_async(conn: AsyncConnection | AsyncSession, steps: Steps[T]) -> T:
    try:
        step = next(steps)
        while True:
            if isinstance(step, Copy):
                bound = await conn.connection() if isinstance(conn, AsyncSession) else conn
                raw = (await bound.get_raw_connection()).driver_connection
                copied = await copy_rows_async(raw, step)
                step = steps.send([] if copied else None)  # type: ignore[arg-type]
                continue
            statement, params = step
            result = await (conn.exec_driver_sql(psycopg_sql(statement), params)
                            if isinstance(conn, AsyncConnection)
                            else conn.execute(statement, params))
            rows = result.fetchall() if result.returns_rows else result.rowcount
            step = steps.send(rows)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def current_transaction(conn: AnyConnection) -> object | None:
    """The caller's open transaction object (stable for the transaction's life), if any.

    psycopg has no such object: there every write carries its NOTIFY, and PostgreSQL
    folds identical notifications of one transaction into one."""
    if isinstance(conn, psycopg.Connection | psycopg.AsyncConnection):
        return None
    if isinstance(conn, AsyncConnection):
        return conn.sync_connection.get_transaction() if conn.sync_connection else None
    if isinstance(conn, AsyncSession):
        return conn.sync_session.get_transaction()
    return conn.get_transaction()


def execution_option(conn: AnyConnection, name: str, default: Any) -> Any:
    """An execution option set on the caller's connection or engine (e.g. to switch off
    NOTIFY behind a pooler: `engine.execution_options(postrelay_notify=False)`)."""
    if isinstance(conn, psycopg.Connection | psycopg.AsyncConnection):
        return default
    if isinstance(conn, AsyncConnection):
        return conn.sync_connection.get_execution_options().get(name, default)  # type: ignore[union-attr]
    if isinstance(conn, Connection):
        return conn.get_execution_options().get(name, default)
    session = conn.sync_session if isinstance(conn, AsyncSession) else conn
    bind = session.get_bind()
    return bind.get_execution_options().get(name, default)


async def driver_fetch(
    conn: AsyncConnection | psycopg.AsyncConnection[Any],
    statement: TextClause,
    params: Any,
    *,
    binary: bool = False,
) -> list[tuple[Any, ...]]:
    """Run `statement` on the psycopg connection (beneath `conn`) and return its rows.

    For the hottest paths only (a worker's claim, a relay batch): SQLAlchemy's async
    execution path adds a greenlet switch and result processing that cost as much CPU as
    the round trip. An SQLAlchemy `conn` must be in autocommit mode or inside a transaction
    SQLAlchemy began (`engine.begin()`), so that no transaction is left for SQLAlchemy to
    track; the statement then runs in that transaction.

    `binary` sends the parameters in binary: psycopg dumps a list in text one element at a
    time with an escaping pass, five times slower than in binary, which matters for the
    statements that carry a batch as arrays. Binary parameters have concrete types, so
    every parameter of such a statement must be cast to the type it is used as."""
    if isinstance(conn, AsyncConnection):
        conn = (await conn.get_raw_connection()).driver_connection
    cursor = await conn.execute(psycopg_sql(statement, binary), params)
    return await cursor.fetchall() if cursor.description else []


async def driver_fetch_after(
    conn: AsyncConnection | psycopg.AsyncConnection[Any],
    first: TextClause,
    statement: TextClause,
    params: Any,
) -> list[tuple[Any, ...]]:
    """`driver_fetch` of `statement`, with `first` (a statement without parameters) sent
    ahead of it in the same round trip (a pipeline, synced once). On a connection in
    autocommit mode both run in one implicit transaction, so what `first` sets with
    `set_config(..., true)` holds for `statement` and ends with its commit: settings
    without session state, for a transaction pooler, at no extra round trip."""
    if isinstance(conn, AsyncConnection):
        conn = (await conn.get_raw_connection()).driver_connection
    async with conn.pipeline():
        await conn.execute(psycopg_sql(first))
        cursor = await conn.execute(psycopg_sql(statement), params)
    return await cursor.fetchall() if cursor.description else []
