"""Run one piece of database logic on whatever the caller holds.

Writes that join the caller's transaction (`enqueue`, `emit`) accept a sync or async
SQLAlchemy Connection or Session, or a plain psycopg (3) connection. The logic is written
once, as a generator that yields `(statement, params)` (or a `Copy`) and receives the rows
(for a statement that returns none, the number of rows it wrote), read by index or by
column name alike (SQLAlchemy's `Row`; named tuples on a psycopg connection). `run_sync`
runs it on a sync connection, `run_async` on an async one; each public write has one entry
point of each kind (`enqueue`, `enqueue_async`) over the same generator.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Awaitable, Coroutine, Generator, Sequence
from typing import Any, TypeAlias, TypeVar, cast

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection, CursorResult, Row, TextClause
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.sql import Executable
from typing_extensions import TypeIs

from postrelay.core.bulkcopy import Copy, copy_rows, copy_rows_async

T = TypeVar("T")
Rows = Sequence[Row[Any]]
# A step yields a statement and its parameters or a Copy. What it receives depends on the
# statement: the rows, the row count of a statement that returns none, or for a Copy a list
# (copied) or None (a guarded copy that hit a taken key) -- hence Any.
Steps = Generator[tuple[Executable, Any] | Copy, Any, T]
SyncConnection: TypeAlias = Connection | Session | psycopg.Connection[Any]
AsyncAnyConnection: TypeAlias = AsyncConnection | AsyncSession | psycopg.AsyncConnection[Any]
AnyConnection: TypeAlias = SyncConnection | AsyncAnyConnection
_DIALECT = psycopg_dialect()  # type: ignore[no-untyped-call]
_PLACEHOLDER = re.compile(r"(?<!%)%\((\w+)\)s")


def run_sync(conn: SyncConnection, steps: Steps[T]) -> T:
    """Run `steps` on a sync SQLAlchemy Connection or Session, or a psycopg connection."""
    if isinstance(conn, Connection | Session):
        return _drive_sync(conn, steps)
    if isinstance(conn, psycopg.Connection):
        return _drive_psycopg(conn, steps)
    raise _wrong_connection(conn)


def run_async(conn: AsyncAnyConnection, steps: Steps[T]) -> Coroutine[Any, Any, T]:
    """Run `steps` on an async SQLAlchemy Connection or Session, or an async psycopg
    connection; the coroutine to await. A plain function, so that a sync connection is
    refused at the call rather than at the await."""
    if isinstance(conn, AsyncConnection | AsyncSession):
        return _drive_async(conn, steps)
    if isinstance(conn, psycopg.AsyncConnection):
        return _drive_psycopg_async(conn, steps)
    steps.close()
    raise _wrong_connection(conn, wanted="an async")


def run_sync_or_deprecated_async(
    conn: AnyConnection, steps: Steps[T], *, async_name: str
) -> T | Coroutine[Any, Any, T]:
    """`run_sync` for a sync entry point; given an async connection, the old behaviour (the
    coroutine to await) with a DeprecationWarning that names the async entry point."""
    if isinstance(conn, Connection):  # the usual caller first: one check, as before
        return _drive_sync(conn, steps)
    if isinstance(conn, AsyncConnection | AsyncSession | psycopg.AsyncConnection):
        warn_async_deprecated(async_name, stacklevel=4)
        return run_async(conn, steps)
    return run_sync(conn, steps)


def is_async_connection(conn: AnyConnection) -> TypeIs[AsyncAnyConnection]:
    return isinstance(conn, AsyncConnection | AsyncSession | psycopg.AsyncConnection)


def warn_async_deprecated(async_name: str, stacklevel: int = 3) -> None:
    """Warn that a sync entry point was given an async connection (it still returns the
    awaitable, for now). `stacklevel` 3 names the line that called the entry point."""
    warnings.warn(
        f"passing an async connection to a sync function is deprecated: "
        f"await {async_name}(conn, ...) instead",
        DeprecationWarning, stacklevel=stacklevel,
    )


def drive(conn: AnyConnection, steps: Steps[T]) -> T | Awaitable[T]:
    """Run `steps` on any connection: at once on a sync one, as an awaitable on an async one
    (the operator's webhook functions, which take either)."""
    if isinstance(conn, AsyncConnection | AsyncSession | psycopg.AsyncConnection):
        return run_async(conn, steps)
    return run_sync(conn, steps)


def _wrong_connection(conn: object, wanted: str = "a") -> TypeError:
    return TypeError(
        f"conn: expected {wanted} SQLAlchemy Connection or Session or psycopg connection, "
        f"got {type(conn)!r}"
    )


@functools.cache
def psycopg_sql(statement: TextClause, binary: bool = False) -> str:
    """The statement in psycopg's `%(name)s` style, compiled once per statement; with
    `binary`, every parameter is sent in binary (`%(name)b`). Its comment lines stay in the
    .sql file: psycopg keeps its conversion of a statement only up to 4 kB of text, and
    reads a longer one again at every execution."""
    sql = "\n".join(line for line in str(statement.compile(dialect=_DIALECT)).splitlines()
                    if not line.lstrip().startswith("--"))
    return _PLACEHOLDER.sub(r"%(\1)b", sql) if binary else sql


def _drive_psycopg(conn: psycopg.Connection[Any], steps: Steps[T]) -> T:
    try:
        step = next(steps)
        while True:
            if isinstance(step, Copy):
                step = steps.send([] if copy_rows(conn, step) else None)
                continue
            statement, params = step
            cursor = conn.cursor(row_factory=namedtuple_row)
            cursor.execute(psycopg_sql(statement), params)
            rows = cursor.fetchall() if cursor.description else cursor.rowcount
            step = steps.send(rows)
    except StopIteration as stop:
        done: T = stop.value
        return done


async def _drive_psycopg_async(conn: psycopg.AsyncConnection[Any], steps: Steps[T]) -> T:
    try:
        step = next(steps)
        while True:
            if isinstance(step, Copy):
                copied = await copy_rows_async(conn, step)
                step = steps.send([] if copied else None)
                continue
            statement, params = step
            cursor = conn.cursor(row_factory=namedtuple_row)
            await cursor.execute(psycopg_sql(statement), params)
            rows = await cursor.fetchall() if cursor.description else cursor.rowcount
            step = steps.send(rows)
    except StopIteration as stop:
        done: T = stop.value
        return done


def _drive_sync(conn: Connection | Session, steps: Steps[T]) -> T:
    try:
        step = next(steps)
        while True:
            if isinstance(step, Copy):
                # COPY has no SQLAlchemy API: it runs on the psycopg connection beneath, in
                # the transaction an earlier step of the same logic began.
                bound = conn.connection() if isinstance(conn, Session) else conn
                copied = copy_rows(_psycopg(bound.connection.driver_connection), step)
                step = steps.send([] if copied else None)
                continue
            statement, params = step
            # A Connection takes the statement as the driver's SQL: SQLAlchemy's compiled
            # path costs a quarter more CPU per statement; its events and echo still see it.
            # A Session keeps its own execute, which flushes pending ORM objects first.
            result = (conn.exec_driver_sql(psycopg_sql(statement), params)
                      if isinstance(conn, Connection)
                      else cast(CursorResult[Any], conn.execute(statement, params)))
            rows = result.fetchall() if result.returns_rows else result.rowcount
            step = steps.send(rows)
    except StopIteration as stop:
        done: T = stop.value
        return done


async def _drive_async(conn: AsyncConnection | AsyncSession, steps: Steps[T]) -> T:
    try:
        step = next(steps)
        while True:
            if isinstance(step, Copy):
                bound = await conn.connection() if isinstance(conn, AsyncSession) else conn
                copied = await copy_rows_async(await psycopg_beneath(bound), step)
                step = steps.send([] if copied else None)
                continue
            statement, params = step
            if isinstance(conn, AsyncConnection):
                result = await conn.exec_driver_sql(psycopg_sql(statement), params)
            else:
                result = cast(CursorResult[Any], await conn.execute(statement, params))
            rows = result.fetchall() if result.returns_rows else result.rowcount
            step = steps.send(rows)
    except StopIteration as stop:
        done: T = stop.value
        return done


def open_transactions(conn: AnyConnection) -> tuple[object, ...]:
    """The caller's open transaction and savepoints, innermost first, each object stable
    for its life; empty outside one.

    What a savepoint did, a NOTIFY included, is undone when it rolls back; so a writer that
    notifies once per transaction asks whether any of these has notified, and marks the
    innermost. psycopg has no such objects: there every write carries its NOTIFY, and
    PostgreSQL folds identical notifications of one transaction into one."""
    if isinstance(conn, psycopg.Connection | psycopg.AsyncConnection):
        return ()
    if isinstance(conn, AsyncConnection):
        if conn.sync_connection is None:
            return ()
        return _connection_transactions(conn.sync_connection)
    if isinstance(conn, Connection):
        return _connection_transactions(conn)
    session = conn.sync_session if isinstance(conn, AsyncSession) else conn
    chain: list[object] = []
    inner = session.get_nested_transaction() or session.get_transaction()
    while inner is not None:
        chain.append(inner)
        inner = inner.parent
    return tuple(chain)


def _connection_transactions(conn: Connection) -> tuple[object, ...]:
    chain: list[object] = []
    nested = conn.get_nested_transaction()
    while nested is not None:
        chain.append(nested)
        # SQLAlchemy has no public name for the savepoint a savepoint was begun in;
        # without it, only the innermost and the root are known (at worst, a NOTIFY more).
        nested = getattr(nested, "_previous_nested", None)
    root = conn.get_transaction()
    if root is not None:
        chain.append(root)
    return tuple(chain)


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
    raw = await psycopg_beneath(conn) if isinstance(conn, AsyncConnection) else conn
    cursor = await raw.execute(psycopg_sql(statement, binary), params)
    return await cursor.fetchall() if cursor.description else []


async def driver_fetch_after(
    conn: AsyncConnection | psycopg.AsyncConnection[Any],
    first: TextClause | None,
    statement: TextClause,
    params: Any,
    *,
    binary: bool = False,
    between: Sequence[tuple[TextClause, Any]] = (),
) -> list[tuple[Any, ...]]:
    """`driver_fetch` of `statement`, with `first` (a statement without parameters; None:
    none) and then the `between` statements (with their parameters, sent in text) ahead of
    it in the same round trip: a pipeline, synced once. On a connection in autocommit mode
    they all run in one implicit transaction, which commits at the sync, or rolls back
    whole when any of them fails; so what `first` sets with `set_config(..., true)` holds
    for the rest and ends with the commit: settings without session state, for a
    transaction pooler, at no extra round trip. Inside a transaction, they hold until it
    ends. Nothing is fetched before the sync: a fetch inside the pipeline would sync it."""
    if first is None and not between:
        return await driver_fetch(conn, statement, params, binary=binary)
    raw = await psycopg_beneath(conn) if isinstance(conn, AsyncConnection) else conn
    async with raw.pipeline():
        if first is not None:
            await raw.execute(psycopg_sql(first))
        for before, before_params in between:
            await raw.execute(psycopg_sql(before), before_params)
        cursor = await raw.execute(psycopg_sql(statement, binary), params)
    return await cursor.fetchall() if cursor.description else []


def _psycopg(driver_connection: object) -> psycopg.Connection[Any]:
    """The psycopg connection beneath a SQLAlchemy one (COPY and driver SQL need it)."""
    if not isinstance(driver_connection, psycopg.Connection):
        raise TypeError("postrelay needs the psycopg driver: a URL of postgresql+psycopg://")
    return driver_connection


async def psycopg_beneath(conn: AsyncConnection) -> psycopg.AsyncConnection[Any]:
    """The psycopg connection beneath an async SQLAlchemy one, in its transaction."""
    driver_connection = (await conn.get_raw_connection()).driver_connection
    if not isinstance(driver_connection, psycopg.AsyncConnection):
        raise TypeError("postrelay needs the psycopg driver: a URL of postgresql+psycopg://")
    return driver_connection
