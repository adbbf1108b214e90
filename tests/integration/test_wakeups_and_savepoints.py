"""The wake-up NOTIFY of `enqueue`, `emit` and their batch forms follows the caller's
transaction through its savepoints: a NOTIFY sent inside a savepoint that is rolled back is
discarded with it, so a later write of the same transaction must send its own, or the
committed work waits for the next poll."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import postrelay.queue as pq
import postrelay.relay as relay
from tests.factories import scalar

CHANNELS = ("postrelay_jobs", "postrelay_outbox")


def write_sync(conn: Any, tenant: Any, size: int) -> None:
    """One job and one event, singly (size 0) or as a batch of `size`."""
    if size == 0:
        pq.enqueue(conn, "reindex", {}, tenant_id=tenant)
        relay.emit(
            conn, "order.placed", {}, tenant_id=tenant, aggregate_type="order", aggregate_id=1
        )
        return
    pq.enqueue_many(conn, [pq.JobSpec("reindex", {"n": n}, tenant) for n in range(size)])
    relay.emit_many(
        conn, [relay.EventSpec("order.placed", {"n": n}, tenant, "order", n) for n in range(size)]
    )


async def write_async(conn: Any, tenant: Any, size: int) -> None:
    if size == 0:
        await pq.enqueue_async(conn, "reindex", {}, tenant_id=tenant)
        await relay.emit_async(
            conn, "order.placed", {}, tenant_id=tenant, aggregate_type="order", aggregate_id=1
        )
        return
    await pq.enqueue_many_async(
        conn, [pq.JobSpec("reindex", {"n": n}, tenant) for n in range(size)]
    )
    await relay.emit_many_async(
        conn, [relay.EventSpec("order.placed", {"n": n}, tenant, "order", n) for n in range(size)]
    )


def heard(listener: psycopg.Connection[Any]) -> list[str]:
    return sorted(n.channel for n in listener.notifies(timeout=0.5))


@pytest.fixture
def listener(libpq: str) -> Any:
    with psycopg.connect(libpq, autocommit=True) as conn:
        for channel in CHANNELS:
            conn.execute(f"LISTEN {channel}")
        yield conn


def committed(engine: Any) -> tuple[int, int]:
    return (
        scalar(engine, "SELECT count(*) FROM mdm.aa_job"),
        scalar(engine, "SELECT count(*) FROM mdm.aa_outbox_event"),
    )


# 0: enqueue and emit; 3: the batches' one-statement INSERT; 40: their COPY.
SIZES = [0, 3, 40]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", ["connection", "session"])
def test_a_write_after_a_rolled_back_savepoint_wakes_on_commit(
    engine, tenant, listener, kind: str, size: int
):
    opened: Callable[[], Any] = (
        engine.begin if kind == "connection" else lambda: Session(engine).begin()
    )
    with opened() as txn:
        conn = txn if kind == "connection" else txn.session
        savepoint = conn.begin_nested()
        write_sync(conn, tenant, size)
        savepoint.rollback()
        write_sync(conn, tenant, size)
    assert committed(engine) == (max(size, 1), max(size, 1))
    assert heard(listener) == sorted(CHANNELS)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", ["connection", "session"])
async def test_an_async_write_after_a_rolled_back_savepoint_wakes_on_commit(
    async_engine, engine, tenant, listener, kind: str, size: int
):
    if kind == "connection":
        async with async_engine.begin() as conn:
            savepoint = await conn.begin_nested()
            await write_async(conn, tenant, size)
            await savepoint.rollback()
            await write_async(conn, tenant, size)
    else:
        async with AsyncSession(async_engine) as session, session.begin():
            nested = await session.begin_nested()
            await write_async(session, tenant, size)
            await nested.rollback()
            await write_async(session, tenant, size)
    assert committed(engine) == (max(size, 1), max(size, 1))
    assert heard(listener) == sorted(CHANNELS)


def test_savepoints_inside_a_woken_transaction_add_no_wake_up(engine, tenant, listener):
    """The transaction's own NOTIFY survives its savepoints' rollbacks: writes inside them
    need none of their own; nor does a write after a released savepoint that sent one."""
    with engine.begin() as conn:
        write_sync(conn, tenant, 0)
        for _ in range(3):
            savepoint = conn.begin_nested()
            write_sync(conn, tenant, 0)
            savepoint.rollback()
        write_sync(conn, tenant, 0)
    with engine.begin() as conn, conn.begin_nested():
        write_sync(conn, tenant, 0)
    assert committed(engine) == (3, 3)
    assert heard(listener) == sorted(CHANNELS * 2)


def test_a_rolled_back_transaction_with_savepoints_wakes_nobody(engine, tenant, listener):
    with engine.connect() as conn, conn.begin():
        with conn.begin_nested():
            write_sync(conn, tenant, 3)
        savepoint = conn.begin_nested()
        write_sync(conn, tenant, 0)
        savepoint.rollback()
        write_sync(conn, tenant, 40)
        conn.rollback()
    assert committed(engine) == (0, 0)
    assert heard(listener) == []
