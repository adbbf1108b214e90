"""Who leads maintenance, and how soon leadership moves when the leader dies: at once on a
direct connection (an advisory lock freed with its connection), within a few rounds behind
a transaction pooler (a row lease)."""

from __future__ import annotations

import asyncio
import time

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from postrelay.core.db import POOLER_OPTION
from postrelay.queue.maintenance import Maintenance, Rescuer, maintenance_interval
from postrelay.queue.maintenance.leader import LEADER_LOCK_KEY, LEASE_ROUNDS

LEASE = 450.0


def keeper(engine, holder: str, interval: float = 10.0) -> Maintenance:
    return Maintenance(engine, holder=holder, interval_secs=interval,
                       rescuer=Rescuer(engine, lease_secs=LEASE, actor=holder))


def lease_row(engine) -> str | None:
    with engine.connect() as conn:
        return conn.execute(text("SELECT holder FROM mdm.aa_lease")).scalar_one_or_none()


def lock_holders(engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(text(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND ((classid::bigint << 32) | objid::bigint) = :key"), {"key": LEADER_LOCK_KEY}
        ).scalars())


def test_the_interval_follows_the_job_lease():
    assert maintenance_interval(30.0, 4.0) == 1.0  # a 4 s lease is checked every second
    assert maintenance_interval(5.0, 450.0) == 5.0
    assert maintenance_interval(0.3, 2.0) == 0.3


async def test_leadership_moves_as_soon_as_the_leaders_connection_drops(engine, async_engine,
                                                                        clean_db):
    a, b = keeper(async_engine, "a"), keeper(async_engine, "b")
    try:
        assert await a.run_once() is True
        assert lease_row(engine) == "a"
        [pid] = lock_holders(engine)
        assert await b.run_once() is False
        # The leader's process dies: its connection is gone, the lease row still says "a"
        # for another 30 s.
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        await _until(lambda: not lock_holders(engine))
        assert await b.run_once() is True  # the next round, not after the row's TTL
        assert lease_row(engine) == "b"
        assert await a.run_once() is False  # reconnected at once; b holds the lock now
    finally:
        await a.stop()
        await b.stop()


async def test_a_leader_that_stalls_without_dying_loses_the_lock_within_its_rounds(
    engine, async_engine, clean_db,
):
    """SIGSTOP, a frozen VM: the leader's connection stays open, but the server closes it
    once it has idled for LEASE_ROUNDS rounds, and the lock goes with it."""
    interval = 0.3
    a, b = keeper(async_engine, "a", interval), keeper(async_engine, "b", interval)
    try:
        assert await a.run_once() is True
        assert await b.run_once() is False
        stalled = time.monotonic()  # `a` is not asked again for a while
        while not await b.run_once():
            assert time.monotonic() - stalled < interval * LEASE_ROUNDS + 2.0, "never led"
            await asyncio.sleep(interval / 3)
        assert lease_row(engine) == "b"
        assert await a.run_once() is False  # back: it finds b leading, and says so quietly
        assert await b.run_once() is True
    finally:
        await a.stop()
        await b.stop()


async def test_a_stopped_leader_frees_the_lock_and_the_row(engine, async_engine, clean_db):
    a, b = keeper(async_engine, "a"), keeper(async_engine, "b")
    try:
        assert await a.run_once() is True
        await a.stop()
        assert lock_holders(engine) == [] and lease_row(engine) is None
        assert await b.run_once() is True
    finally:
        await b.stop()


async def test_behind_a_pooler_a_dead_leaders_row_lease_runs_out_within_its_rounds(
    engine, database_url, clean_db,
):
    # Only the mode matters here: a pooled engine takes no locks, whatever it reaches.
    pooled = create_async_engine(database_url, execution_options={POOLER_OPTION: True})
    interval = 0.3
    a, b = keeper(pooled, "a", interval), keeper(pooled, "b", interval)
    try:
        assert await a.run_once() is True
        assert lock_holders(engine) == []  # no session state behind a pooler
        assert await b.run_once() is False
        died = time.monotonic()  # `a` is never asked again, as if SIGKILLed
        while not await b.run_once():
            assert time.monotonic() - died < interval * LEASE_ROUNDS + 1.0
            await asyncio.sleep(interval / 3)
        assert time.monotonic() - died >= interval * (LEASE_ROUNDS - 1)  # not before
        assert lease_row(engine) == "b"
    finally:
        await b.stop()
        await pooled.dispose()


async def _until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)
