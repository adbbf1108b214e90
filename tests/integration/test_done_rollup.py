"""The done rollup (queue/maintenance/rollup.py): the overview's done jobs per minute are
the truth, whether a minute comes from the tally or is counted live, whatever the rounds
and however many leaders run them."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.dashboard import queries as dashboard
from postrelay.queue import Registry, enqueue_many, ensure_tenant
from postrelay.queue.jobspec import JobSpec
from postrelay.queue.maintenance import DoneRollup, Maintenance, Rescuer
from postrelay.queue.maintenance.rollup import (
    CATCH_UP,
    KEEP,
    MARGIN,
    MAX_MINUTES_PER_ROUND,
    ROLLUP_SQL,
    RollupResult,
)
from postrelay.queue.model import Job
from tests.factories import insert_job
from tests.integration.worker_helpers import (
    as_awaitable,
    make_worker,
    wait_until,
    waiting_on_a_lock,
)

MINUTE = timedelta(minutes=1)


@pytest.fixture
def other_tenant(engine: Engine, tenant: uuid.UUID) -> uuid.UUID:
    with engine.begin() as conn:
        return ensure_tenant(conn, "globex")


def db_now(engine: Engine) -> datetime:
    with engine.connect() as conn:
        return conn.execute(text("SELECT now()")).scalar_one()


def add_done(engine: Engine, tenant_id: uuid.UUID, *completed: datetime) -> None:
    with engine.begin() as conn:
        for at in completed:
            insert_job(conn, tenant_id=tenant_id, status="done", completed_at=at)


def truth(engine: Engine, scope: uuid.UUID | None) -> dict[datetime, int]:
    """Done jobs per minute of the last 55 minutes, counted from the jobs themselves (the
    tests put none near the edge of the overview's hour)."""
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT date_trunc('minute', completed_at), count(*) FROM mdm.aa_job"
            " WHERE status = 'done' AND completed_at >= now() - interval '55 minutes'"
            " AND (CAST(:t AS uuid) IS NULL OR tenant_id = CAST(:t AS uuid)) GROUP BY 1"),
            {"t": scope}).all()
    return {minute: n for minute, n in rows}


def page(engine: Engine, scope: uuid.UUID | None) -> dict[datetime, int]:
    """The overview's done per minute, the minutes with any."""
    with engine.connect() as conn:
        overview = dashboard.overview(conn, scope)
    return {minute: done for minute, done, _ in overview.minutes if done}


def tally(engine: Engine) -> dict[tuple[datetime, uuid.UUID], int]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT minute, tenant_id, done FROM mdm.aa_job_done_minute")).all()
    return {(minute, tenant_id): done for minute, tenant_id, done in rows}


def mark(engine: Engine) -> datetime | None:
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT until FROM mdm.aa_job_done_rollup")).scalar_one_or_none()


async def roll_up_all(rollup: DoneRollup) -> list[RollupResult]:
    """Rounds until one finds nothing left to tally."""
    rounds = []
    while (result := await rollup.run_once()).minutes:
        rounds.append(result)
    return rounds


def spread(now: datetime) -> list[datetime]:
    """Completion times across the last 50 minutes: on both sides of minute boundaries
    (the last microsecond of a minute, the first of the next), in the margin, and now."""
    top = now.replace(second=0, microsecond=0)
    times = [top - timedelta(minutes=m, seconds=s) for m in (50, 44, 31, 12, 5)
             for s in (0, 17, 41)]
    for m in (30, 20, 2):
        edge = top - timedelta(minutes=m)
        times += [edge - timedelta(microseconds=1), edge, edge]
    return [*times, now - timedelta(seconds=30), now]


async def test_the_page_sums_the_tally_and_counts_the_rest_live(
        engine, async_engine: AsyncEngine, tenant, other_tenant):
    now = db_now(engine)
    add_done(engine, tenant, *spread(now))
    add_done(engine, other_tenant, *spread(now)[::3])
    add_done(engine, tenant, now - timedelta(hours=3))  # before the hour
    with engine.begin() as conn:  # finished otherwise, or not at all: not done
        insert_job(conn, tenant_id=tenant, status="failed", completed_at=now)
        insert_job(conn, tenant_id=tenant, status="pending")
    scopes = (None, tenant, other_tenant)
    expected = {scope: truth(engine, scope) for scope in scopes}
    assert len(expected[tenant]) >= 15
    # No tally yet: the whole hour counted live.
    assert {scope: page(engine, scope) for scope in scopes} == expected

    rounds = await roll_up_all(DoneRollup(async_engine))
    assert len(rounds) == CATCH_UP // MINUTE // MAX_MINUTES_PER_ROUND
    until = mark(engine)
    assert until is not None
    # Every minute that ended more than the margin ago, and none after.
    assert until in {(t - MARGIN).replace(second=0, microsecond=0)
                     for t in (now, db_now(engine))}
    tallied = tally(engine)
    assert tallied and all(minute < until for minute, _ in tallied)
    for scope in (tenant, other_tenant):
        assert {m: n for (m, t), n in tallied.items() if t == scope} == {
            m: n for m, n in expected[scope].items() if m < until}
    assert {scope: page(engine, scope) for scope in scopes} == expected

    # The tallied minutes are read from the tally: their jobs gone (deleted by hand), the
    # page still counts them; the minutes from the mark on are counted as they are now.
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM mdm.aa_job WHERE completed_at < :until"),
                     {"until": until})
    add_done(engine, other_tenant, db_now(engine))
    later = truth(engine, None)
    assert all(m >= until for m in later)
    assert page(engine, None) == {**{m: n for m, n in expected[None].items() if m < until},
                                  **later}


async def test_rounds_again_and_leaders_racing_count_each_minute_once(
        engine, async_engine: AsyncEngine, tenant, other_tenant):
    now = db_now(engine)
    add_done(engine, tenant, *spread(now))
    add_done(engine, other_tenant, *spread(now)[1::2])
    expected = {scope: truth(engine, scope) for scope in (None, tenant, other_tenant)}
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO mdm.aa_job_done_rollup (id) VALUES (true)"))

    # Two leaders (a lease that changed hands mid-round) start a round while the mark's
    # row is locked: both wait, then run one after the other.
    a, b = DoneRollup(async_engine), DoneRollup(async_engine)
    with engine.connect() as blocker:
        blocker.execute(text("SELECT * FROM mdm.aa_job_done_rollup FOR UPDATE"))
        rounds = asyncio.gather(a.run_once(), b.run_once())
        try:
            await wait_until(lambda: asyncio.to_thread(
                waiting_on_a_lock, engine, 2, "aa_job_done_rollup"))
        finally:  # let them finish whatever happened, so no transaction is left open
            blocker.commit()
            first, second = await rounds
    # The second found the minutes the first tallied and took the next ones.
    assert first.minutes == second.minutes == MAX_MINUTES_PER_ROUND
    assert first.until != second.until
    await roll_up_all(a)
    await asyncio.gather(a.run_once(), b.run_once())  # nothing left: they tally nothing
    assert (await b.run_once()).minutes == 0
    counted = tally(engine)
    until = mark(engine)
    assert until is not None
    for scope in (tenant, other_tenant):
        assert {m: n for (m, t), n in counted.items() if t == scope} == {
            m: n for m, n in expected[scope].items() if m < until}
        assert page(engine, scope) == expected[scope]
    assert page(engine, None) == expected[None]

    # The mark lost (cleared by hand): the minutes are tallied again and replace their
    # counts, they do not add to them.
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_job_done_rollup SET until = NULL"))
    await roll_up_all(a)
    assert tally(engine) == counted
    assert page(engine, None) == expected[None]



async def test_a_leader_stalled_inside_its_round_does_not_hold_the_next_one_for_good(
        engine, async_engine: AsyncEngine, tenant):
    """A leader stopped (SIGSTOP, a frozen VM) between the mark and its commit keeps the
    mark's lock; the next leader's round, and with it every later rescue, waited behind it
    until the stalled process came back. The stalled transaction now ends itself."""
    add_done(engine, tenant, *spread(db_now(engine)))
    stalled = engine.connect()
    try:
        stalled.execute(ROLLUP_SQL["job_done_rollup_mark"], {"now": None, "margin_secs": 15.0})
        started = time.monotonic()
        result = await asyncio.wait_for(DoneRollup(async_engine).run_once(), timeout=20)
        assert result.minutes == MAX_MINUTES_PER_ROUND
        assert time.monotonic() - started < 15
    finally:
        stalled.invalidate()
        stalled.close()


async def test_catch_up_covers_the_last_hour_a_round_at_a_time_and_old_tallies_go(
        engine, async_engine: AsyncEngine, tenant):
    now = db_now(engine)
    top = now.replace(second=0, microsecond=0)
    add_done(engine, tenant, top - timedelta(hours=2), top - timedelta(minutes=40))
    with engine.begin() as conn:  # no leader for three hours; a tally from two days ago
        conn.execute(text("INSERT INTO mdm.aa_job_done_rollup (id, until) VALUES (true, :u)"),
                     {"u": top - timedelta(hours=3)})
        conn.execute(text("INSERT INTO mdm.aa_job_done_minute VALUES (:m, :t, 7)"),
                     {"m": top - KEEP - timedelta(hours=1), "t": tenant})
    rollup = DoneRollup(async_engine)
    first = await rollup.run_once()
    assert first.minutes == MAX_MINUTES_PER_ROUND
    # From the last hour on, not from the mark; the two-day-old row is gone.
    assert first.until is not None
    cutoff = first.until - MAX_MINUTES_PER_ROUND * MINUTE + CATCH_UP
    assert cutoff in {(t - MARGIN).replace(second=0, microsecond=0)
                      for t in (now, db_now(engine))}
    rest = await roll_up_all(rollup)
    assert all(r.minutes <= MAX_MINUTES_PER_ROUND for r in rest)
    assert tally(engine) == {(top - timedelta(minutes=40), tenant): 1}
    assert page(engine, tenant) == {top - timedelta(minutes=40): 1}


async def test_the_maintenance_leader_tallies_and_a_follower_does_not(
        engine, async_engine: AsyncEngine, tenant):
    add_done(engine, tenant, db_now(engine) - timedelta(minutes=10))

    def keeper(holder: str) -> Maintenance:
        return Maintenance(async_engine, holder=holder, interval_secs=10,
                           rescuer=Rescuer(async_engine, lease_secs=450, actor=holder),
                           rollups=(DoneRollup(async_engine),))

    leader, follower = keeper("a"), keeper("b")
    try:
        assert await leader.run_once() is True
        assert mark(engine) is not None
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE mdm.aa_job_done_rollup, mdm.aa_job_done_minute"))
        assert await follower.run_once() is False
        assert mark(engine) is None and tally(engine) == {}
    finally:
        await leader.stop()
        await follower.stop()


async def test_jobs_a_worker_completes_are_tallied(engine, async_engine: AsyncEngine, libpq,
                                                   tenant, other_tenant):
    registry = Registry()

    @registry.handler("reindex")
    async def reindex(job: Job) -> None:
        pass

    with engine.begin() as conn:
        enqueue_many(conn, [JobSpec("reindex", {"n": i}, tenant if i % 3 else other_tenant)
                            for i in range(60)])
    worker = make_worker(async_engine, libpq, registry)
    await worker.start()
    try:
        await wait_until(lambda: as_awaitable(sum(truth(engine, None).values()) == 60))
    finally:
        await worker.stop()
    # Two minutes later (a clock passed in), every minute they finished in has closed.
    later = db_now(engine) + MARGIN + MINUTE
    rollup = DoneRollup(async_engine)
    while (await rollup.run_once(later)).minutes:
        pass
    counted = tally(engine)
    assert sum(n for (_, t), n in counted.items() if t == tenant) == 40
    assert sum(n for (_, t), n in counted.items() if t == other_tenant) == 20
    assert page(engine, None) == truth(engine, None)
