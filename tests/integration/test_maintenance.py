"""Rescue of stale claims, retention and the maintenance lease, driven by run_once()."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import text

from postrelay.core import clock
from postrelay.core.clock import utcnow
from postrelay.queue import queries
from postrelay.queue.maintenance import Maintenance, Rescuer
from postrelay.queue.maintenance.retention import cleanup_handler, delete_done_before
from postrelay.queue.model import Job
from tests.factories import audit_rows, insert_job, job_row

LEASE = 450.0


async def test_stale_claim_of_dead_worker_goes_back_to_pending(engine, async_engine, tenant):
    now = utcnow()
    with engine.begin() as conn:
        stale = insert_job(conn, tenant_id=tenant, status="running", attempts=1,
                           claimed_by="host/1/dead", claimed_at=now - timedelta(hours=1))
        fresh = insert_job(conn, tenant_id=tenant, status="running", attempts=1,
                           claimed_by="host/1/dead", claimed_at=now - timedelta(seconds=10))
    result = await Rescuer(async_engine, lease_secs=LEASE, actor="test").run_once(now)
    assert (result.pending, result.dlq) == (1, 0)
    with engine.connect() as conn:
        row = job_row(conn, stale)
        assert row["state"] == "pending" and row["attempts"] == 1
        assert "lease expired" in row["last_error"]
        assert [a["action"] for a in audit_rows(conn, stale)] == ["job_rescued"]
        assert job_row(conn, fresh)["state"] == "running"


async def test_stale_claim_on_last_attempt_goes_to_dlq(engine, async_engine, tenant):
    now = utcnow()
    with engine.begin() as conn:
        job_id = insert_job(conn, tenant_id=tenant, status="running", attempts=3, max_attempts=3,
                            claimed_by="host/1/dead", claimed_at=now - timedelta(hours=1))
    result = await Rescuer(async_engine, lease_secs=LEASE, actor="test").run_once(now)
    assert (result.pending, result.dlq) == (0, 1)
    with engine.connect() as conn:
        row = job_row(conn, job_id)
        assert row["state"] == "dlq" and row["completed_at"] is not None
        assert [a["action"] for a in audit_rows(conn, job_id)] == ["job_dlq"]


async def test_long_job_of_a_live_worker_is_left_alone(engine, async_engine, tenant):
    now = utcnow()
    async with async_engine.begin() as conn:
        await queries.worker_register(conn, id="host/2/alive", host="host", pid=2, tenants=None,
                                      kinds=None, concurrency=1)
    with engine.begin() as conn:
        job_id = insert_job(conn, tenant_id=tenant, status="running", attempts=1,
                            claimed_by="host/2/alive", claimed_at=now - timedelta(hours=2))
    result = await Rescuer(async_engine, lease_secs=LEASE, actor="test").run_once()
    assert (result.pending, result.dlq) == (0, 0)
    with engine.connect() as conn:
        assert job_row(conn, job_id)["state"] == "running"
    # Once the heartbeat is older than the lease, the worker counts as dead.
    later = utcnow() + timedelta(seconds=LEASE + 1)
    result = await Rescuer(async_engine, lease_secs=LEASE, actor="test").run_once(later)
    assert result.pending == 1 and result.workers_pruned == 1


async def _finalize_done(conn, **guard):
    return await queries.job_finalize_many(
        conn, **guard, statuses=["done"], delays=[None], errors=[None], refunds=[False])


@pytest.mark.parametrize("write_done", [_finalize_done, queries.job_complete_many],
                         ids=["job_finalize_many", "job_complete_many"])
async def test_late_finish_after_rescue_does_not_overwrite(engine, async_engine, tenant,
                                                           write_done):
    now = utcnow()
    with engine.begin() as conn:
        job_id = insert_job(conn, tenant_id=tenant, status="running", attempts=1,
                            claimed_by="host/1/slow", claimed_at=now - timedelta(hours=1))
    await Rescuer(async_engine, lease_secs=LEASE, actor="test").run_once(now)
    async with async_engine.begin() as conn:
        (claimed,) = await queries.job_claim(conn, worker="host/3/new", demand=1,
                                             tenant_ids=None, kinds=None)
    assert claimed.id == job_id and claimed.attempts == 2
    async with async_engine.begin() as conn:  # the first worker finally reports
        written = await write_done(conn, worker="host/1/slow", ids=[job_id], attempts=[1])
    assert written == set()
    with engine.connect() as conn:
        row = job_row(conn, job_id)
    assert row["state"] == "running" and row["claimed_by"] == "host/3/new"


async def test_retention_deletes_only_old_done_jobs(engine, async_engine, tenant):
    now = utcnow()
    old = now - timedelta(days=15)
    with engine.begin() as conn:
        old_done = [insert_job(conn, tenant_id=tenant, status="done", completed_at=old)
                    for _ in range(2500)]
        recent_done = insert_job(conn, tenant_id=tenant, status="done",
                                 completed_at=now - timedelta(days=13))
        keep = [insert_job(conn, tenant_id=tenant, status=s, completed_at=old)
                for s in ("dlq", "failed")]
        keep.append(insert_job(conn, tenant_id=tenant, status="pending"))
    deleted = await delete_done_before(async_engine, now - timedelta(days=14))
    assert deleted == 2500
    with engine.connect() as conn:
        remaining = set(conn.execute(text("SELECT id FROM mdm.aa_job")).scalars())
    assert remaining == {recent_done, *keep}
    assert not remaining & set(old_done)


async def test_cleanup_jobs_handler_takes_its_window_from_settings_never_the_payload(
        engine, async_engine, tenant):
    now = utcnow()
    with engine.begin() as conn:
        three_days = insert_job(conn, tenant_id=tenant, status="done",
                                completed_at=now - timedelta(days=3))
        one_day = insert_job(conn, tenant_id=tenant, status="done",
                             completed_at=now - timedelta(days=1))
    # A payload asking for a zero-day window deletes nothing inside the configured 14 days.
    handler = cleanup_handler(async_engine, default_days=14)
    await handler(Job(three_days, tenant, "cleanup_jobs", {"retention_days": 0}, 100, 1, 3,
                      now, now, now, None))
    with engine.connect() as conn:
        ids = set(conn.execute(text("SELECT id FROM mdm.aa_job")).scalars())
    assert ids == {three_days, one_day}
    # The configured window is what counts.
    handler = cleanup_handler(async_engine, default_days=2)
    await handler(Job(three_days, tenant, "cleanup_jobs", {"retention_days": 30}, 100, 1, 3,
                      now, now, now, None))
    with engine.connect() as conn:
        ids = set(conn.execute(text("SELECT id FROM mdm.aa_job")).scalars())
    assert ids == {one_day}


async def test_only_one_process_leads_maintenance(engine, async_engine, clean_db):
    def keeper(holder: str) -> Maintenance:
        return Maintenance(async_engine, holder=holder, interval_secs=10,
                           rescuer=Rescuer(async_engine, lease_secs=LEASE, actor=holder))

    a, b = keeper("a"), keeper("b")
    assert await a.run_once() is True
    assert await b.run_once() is False
    assert await a.run_once() is True  # the leader renews
    await a.stop()  # releases the lease
    assert await b.run_once() is True
    await b.stop()


@pytest.mark.parametrize("skew", [timedelta(hours=1), -timedelta(hours=1)],
                         ids=["host_clock_fast", "host_clock_slow"])
async def test_rescue_reads_the_database_clock_not_the_hosts(engine, async_engine, tenant,
                                                             monkeypatch, skew):
    """Claims and heartbeats carry the database's time; a leader on a host whose clock is
    off must neither take a live worker's jobs (fast) nor leave a dead one's (slow)."""
    real = clock.datetime

    class SkewedClock(real):  # this host's clock, off by `skew`
        @classmethod
        def now(cls, tz=None):
            return real.now(tz) + skew

    async with async_engine.begin() as conn:
        await queries.worker_register(conn, id="host/4/alive", host="host", pid=4, tenants=None,
                                      kinds=None, concurrency=1)
    with engine.begin() as conn:
        db_now = conn.execute(text("SELECT now()")).scalar_one()
        live = insert_job(conn, tenant_id=tenant, status="running", attempts=1,
                          claimed_by="host/4/alive", claimed_at=db_now - timedelta(seconds=5))
        dead = insert_job(conn, tenant_id=tenant, status="running", attempts=1,
                          claimed_by="host/5/dead", claimed_at=db_now - timedelta(seconds=500))
    monkeypatch.setattr(clock, "datetime", SkewedClock)
    result = await Rescuer(async_engine, lease_secs=LEASE, actor="test").run_once()
    assert (result.pending, result.workers_pruned) == (1, 0)
    with engine.connect() as conn:
        assert job_row(conn, live)["state"] == "running"
        assert job_row(conn, dead)["state"] == "pending"
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_worker "
                                 "WHERE id = 'host/4/alive'")).scalar_one() == 1


async def test_a_hand_written_running_row_without_a_claim_time_is_rescued(engine, async_engine,
                                                                        tenant):
    """`UPDATE ... SET status = 'running'` by hand leaves no claim time and maybe no worker:
    no worker holds the job and no claim takes it, so only the rescuer can bring it back."""
    with engine.begin() as conn:
        unclaimed = insert_job(conn, tenant_id=tenant, status="running", attempts=0)
        last = insert_job(conn, tenant_id=tenant, status="running", attempts=3, max_attempts=3,
                          claimed_by="host/6/gone")
    result = await Rescuer(async_engine, lease_secs=LEASE, actor="test").run_once()
    assert (result.pending, result.dlq) == (1, 1)
    with engine.connect() as conn:
        row = job_row(conn, unclaimed)
        assert row["state"] == "pending" and "lease expired" in row["last_error"]
        assert [a["action"] for a in audit_rows(conn, unclaimed)] == ["job_rescued"]
        assert job_row(conn, last)["state"] == "dlq"
        assert [a["action"] for a in audit_rows(conn, last)] == ["job_dlq"]


async def test_retention_measures_its_window_on_the_database_clock(engine, async_engine, tenant,
                                                                   monkeypatch):
    """completed_at is the database's time: a worker whose host clock runs a month fast
    must not delete the jobs done yesterday under a 14-day window."""
    real = clock.datetime

    class MonthFast(real):
        @classmethod
        def now(cls, tz=None):
            return real.now(tz) + timedelta(days=30)

    with engine.begin() as conn:
        db_now = conn.execute(text("SELECT now()")).scalar_one()
        yesterday = insert_job(conn, tenant_id=tenant, status="done",
                               completed_at=db_now - timedelta(days=1))
        old = insert_job(conn, tenant_id=tenant, status="done",
                         completed_at=db_now - timedelta(days=15))
    monkeypatch.setattr(clock, "datetime", MonthFast)
    now = db_now
    handler = cleanup_handler(async_engine, default_days=14)
    await handler(Job(old, tenant, "cleanup_jobs", {}, 100, 1, 3, now, now, now, None))
    with engine.connect() as conn:
        assert set(conn.execute(text("SELECT id FROM mdm.aa_job")).scalars()) == {yesterday}


async def test_a_rescue_stalled_before_its_commit_lets_its_jobs_go(engine, async_engine, tenant):
    """A leader stopped between its rescue and the commit keeps the rows locked: other
    rescues skip them and no claim sees them pending. The transaction ends itself."""
    with engine.begin() as conn:
        job_id = insert_job(conn, tenant_id=tenant, status="running", attempts=1,
                            claimed_by="host/7/dead", claimed_at=utcnow() - timedelta(hours=1))
    stalled = engine.connect()
    try:
        stalled.execute(queries.JOB_SQL["job_rescue_stale"],
                        {"now": None, "lease_secs": LEASE, "limit": 10, "actor": "stalled"})
        rescuer = Rescuer(async_engine, lease_secs=LEASE, actor="test")
        assert (await rescuer.run_once()).pending == 0  # locked by the stalled leader
        await asyncio.sleep(6)
        assert (await rescuer.run_once()).pending == 1
    finally:
        stalled.invalidate()
        stalled.close()
    with engine.connect() as conn:
        assert job_row(conn, job_id)["state"] == "pending"
        assert [(a["action"], a["actor"]) for a in audit_rows(conn, job_id)] == [
            ("job_rescued", "test")]


@pytest.mark.parametrize("claimed_at",
                         ["'infinity'", "'-infinity'", "now() + interval '10 years'"],
                         ids=["infinity", "minus_infinity", "years_ahead"])
async def test_a_hand_written_claim_time_no_clock_could_have_written_is_rescued(
        engine, async_engine, tenant, claimed_at):
    """Claims carry the database's time, so a claim time in the future beyond any clock
    skew (or at an infinity) was written by hand. `infinity` was never older than the lease:
    the job stayed `running` for ever. Its audit row names no claim moment (none was), so
    the email attempt reading it cannot take it for one; last_error keeps what was written."""
    with engine.begin() as conn:
        job_id = insert_job(conn, tenant_id=tenant, status="running", attempts=1,
                            claimed_by="host/8/gone")
        last = insert_job(conn, tenant_id=tenant, status="running", attempts=3, max_attempts=3,
                          claimed_by="host/8/gone")
        # A little ahead, as a claim is after the database's clock was stepped back: not
        # stale before its worker has been silent for a lease past it.
        ahead = insert_job(conn, tenant_id=tenant, status="running", attempts=1,
                           claimed_by="host/8/gone")
        conn.execute(text(f"UPDATE mdm.aa_job SET claimed_at = {claimed_at} "
                          "WHERE id = ANY(:ids)"), {"ids": [job_id, last]})
        conn.execute(text("UPDATE mdm.aa_job SET claimed_at = now() + interval '10 seconds' "
                          "WHERE id = :id"), {"id": ahead})
    result = await Rescuer(async_engine, lease_secs=LEASE, actor="test").run_once()
    assert (result.pending, result.dlq) == (1, 1)
    with engine.connect() as conn:
        # The claim time stays as written: the driver here reads no infinity, so not `*`.
        states = dict(conn.execute(text(
            "SELECT id, status::text || ' ' || coalesce(last_error, '') FROM mdm.aa_job"
        )).all())
        written = conn.execute(text(
            "SELECT claimed_at::text FROM mdm.aa_job WHERE id = :id"), {"id": job_id}).scalar()
        assert states[job_id].startswith("pending lease expired")
        assert states[job_id].endswith(f"claimed at {written}")
        [audit] = audit_rows(conn, job_id)
        assert audit["action"] == "job_rescued" and audit["detail"]["claimed_at"] is None
        assert audit["detail"]["last_error"] == states[job_id].removeprefix("pending ")
        assert states[last].startswith("dlq ")
        assert states[ahead] == "running "


def _window_across_a_dst_change(now):
    """A zone and a window (days) that ends an hour later on the wall clock than on UTC's:
    daylight time now, standard time the window's length ago, neither near a change."""
    from zoneinfo import ZoneInfo

    for zone in ("Europe/Berlin", "Australia/Sydney"):
        tz = ZoneInfo(zone)
        for days in range(30, 330, 10):
            ends = [now + timedelta(days=d) for d in (-days - 2, -days + 2)]
            starts = [now + timedelta(days=d) for d in (-2, 2)]
            offsets = [t.astimezone(tz).utcoffset() for t in (*ends, *starts)]
            if offsets[0] == offsets[1] and offsets[2] == offsets[3] and (
                    offsets[2] - offsets[0] == timedelta(hours=1)):
                return zone, days
    raise AssertionError("no window across a DST change found")


async def test_retention_windows_are_whole_days_whatever_the_sessions_time_zone(
        database_url, engine, tenant):
    """The database's time comes back in the session's zone (the server's `timezone`, the
    host's on many servers, or PGTZ), and subtracting days from it counted wall-clock
    days: across a change to daylight time the window was an hour short, and jobs were
    deleted an hour before it ended."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from postrelay.core.db import sqlalchemy_url

    with engine.connect() as conn:
        db_now = conn.execute(text("SELECT now()")).scalar_one()
    zone, days = _window_across_a_dst_change(db_now)
    with engine.begin() as conn:
        inside = insert_job(conn, tenant_id=tenant, status="done",
                            completed_at=db_now - timedelta(days=days, minutes=-30))
        outside = insert_job(conn, tenant_id=tenant, status="done",
                             completed_at=db_now - timedelta(days=days, minutes=30))
    zoned = create_async_engine(sqlalchemy_url(database_url),
                                connect_args={"options": f"-c timezone={zone}"})
    try:
        handler = cleanup_handler(zoned, default_days=days)
        await handler(Job(outside, tenant, "cleanup_jobs", {}, 100, 1, 3, db_now, db_now,
                          db_now, None))
    finally:
        await zoned.dispose()
    with engine.connect() as conn:
        assert set(conn.execute(text("SELECT id FROM mdm.aa_job")).scalars()) == {inside}
