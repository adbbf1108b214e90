"""Throttled destinations (queue/throttles.py) on a real PostgreSQL: what a refusal writes,
what the limited claim (sql/limited.sql, job_claim_limited) then takes, how the rate steps back
up, how the throttle ends, and idle limit buckets pruned by maintenance. Time is moved by
rewriting the rows' times, never by sleeping."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from postrelay.queue import (
    FlowKeeper,
    ThrottlePolicy,
    ensure_tenant,
    limit_set,
    queries,
    throttle_list,
    throttle_refused,
)
from tests.factories import insert_job

ACTOR = "test:ops"
# Steps long beside the time a test takes on a loaded machine: rates move by the shifts.
POLICY = ThrottlePolicy(step_secs=100.0, floor_per_sec=1.0, free_per_sec=8.0)


@pytest.fixture
async def aengine(database_url):
    engine = create_async_engine(database_url)
    yield engine
    await engine.dispose()


@pytest.fixture
def claim(aengine):
    auto = aengine.execution_options(isolation_level="AUTOCOMMIT")

    async def run(demand: int = 50, kinds=("virus_scan",)):
        async with auto.connect() as conn:
            return await queries.job_claim_limited(conn, worker="w", demand=demand,
                                                   tenant_ids=None, kinds=list(kinds))

    return run


def jobs(engine, tenant_id, n: int, kind: str = "virus_scan", **payload) -> list[uuid.UUID]:
    with engine.begin() as conn:
        return [insert_job(conn, tenant_id=tenant_id, kind=kind, payload=dict(payload))
                for _ in range(n)]


def shift(engine, secs: float) -> None:
    """As if `secs` had passed for every throttle and bucket."""
    with engine.begin() as conn:
        conn.execute(text(
            "UPDATE mdm.aa_job_throttle"
            " SET paused_until = paused_until - make_interval(secs => :s),"
            " ends_at = ends_at - make_interval(secs => :s),"
            " refilled_at = refilled_at - make_interval(secs => :s),"
            " started_at = started_at - make_interval(secs => :s),"
            " changed_at = changed_at - make_interval(secs => :s)"), {"s": secs})
        conn.execute(text("UPDATE mdm.aa_job_limit_bucket "
                          "SET refilled_at = refilled_at - make_interval(secs => :s)"),
                     {"s": secs})


async def refuse(aengine, *, key_path=None, key="", tenant_id=None, pause=2.0,
                 reason="454 4.7.0 slow down") -> bool:
    return await throttle_refused(aengine, POLICY, kind="virus_scan", key_path=key_path,
                                  key=key, tenant_id=tenant_id, pause_secs=pause,
                                  reason=reason, actor="test")


async def limited_kinds(aengine) -> set[str]:
    async with aengine.connect() as conn:
        return await queries.job_limit_kinds(conn)


def audit(engine) -> list[str]:
    with engine.connect() as conn:
        return [a for (a,) in conn.execute(text(
            "SELECT action FROM mdm.aa_flow_audit ORDER BY id"))]


async def test_an_unlimited_kind_is_paused_then_recovers_from_the_floor_and_ends(
        engine, aengine, tenant, claim):
    jobs(engine, tenant, 200)
    assert "virus_scan" not in await limited_kinds(aengine)
    assert await refuse(aengine) is True
    assert "virus_scan" in await limited_kinds(aengine)  # claimed by the limited claim now
    assert await claim() == []  # paused
    shift(engine, 2.0)  # the pause is over: one token, at the floor of 1/s
    assert len(await claim()) == 1
    assert await claim() == []
    shift(engine, 100.0)  # one step: 2/s, a bucket of at most one second's worth
    assert len(await claim()) == 2
    shift(engine, 100.0)  # two steps: 4/s
    assert len(await claim()) == 4
    with engine.connect() as conn:
        [shown] = throttle_list(conn)
    assert shown.recovers_to is None and shown.rate_now == pytest.approx(4.0, rel=0.1)
    assert shown.reason == "454 4.7.0 slow down" and shown.refusals == 1
    shift(engine, 100.0)  # three steps: 8/s, the free rate: over
    with engine.connect() as conn:
        assert throttle_list(conn) == []
    assert "virus_scan" not in await limited_kinds(aengine)  # back to job_claim
    result = await FlowKeeper(aengine).run_once()
    assert result.throttles_ended == 1
    assert audit(engine) == ["throttle_started", "throttle_ended"]


async def test_a_configured_rate_is_halved_and_restored(engine, aengine, tenant, claim):
    jobs(engine, tenant, 100)
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind="virus_scan", rate="8/s")
    await refuse(aengine, pause=0)  # no pause given: at least a second
    assert await claim() == []
    shift(engine, 1.0)
    with engine.connect() as conn:
        [shown] = throttle_list(conn)
    assert shown.rate_now == pytest.approx(4.0, rel=0.1) and shown.recovers_to == 8.0
    assert (shown.ends_at - shown.paused_until).total_seconds() == pytest.approx(100.0)
    shift(engine, 1.0)
    assert len(await claim()) == 4  # one second's worth at 4/s, not the limit's burst of 8
    shift(engine, 200.0)  # the throttle is over: the limit alone, a full bucket of 8
    assert len(await claim()) == 8


async def test_refusals_during_the_pause_count_but_halve_only_once(engine, aengine, tenant):
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind="virus_scan", rate="64/s")
    assert await refuse(aengine) is True
    assert await refuse(aengine) is False
    assert await refuse(aengine) is False  # sends already under way, refused too
    shift(engine, 52.0)  # sending again for half a step: 32/s * 2^0.5 reached
    with engine.connect() as conn:
        [before] = throttle_list(conn)
    assert before.refusals == 3 and before.rate_now == pytest.approx(45.25, rel=0.1)
    await refuse(aengine, pause=1.0)  # refused again: half of what it had reached
    shift(engine, 1.0)
    with engine.connect() as conn:
        [after] = throttle_list(conn)
    assert after.rate_now == pytest.approx(22.6, rel=0.1) and after.refusals == 4
    assert audit(engine) == ["limit_set", "throttle_started"]


async def test_a_throttled_key_holds_its_jobs_only(engine, aengine, tenant, claim):
    jobs(engine, tenant, 5, endpoint_id="a")
    jobs(engine, tenant, 5, endpoint_id="b")
    await refuse(aengine, key_path=["endpoint_id"], key="a", tenant_id=tenant, pause=30)
    got = Counter(j.payload["endpoint_id"] for j in await claim())
    assert got == {"b": 5}
    with engine.begin() as conn:
        other = ensure_tenant(conn, "globex")
        [shown] = throttle_list(conn, tenant_id=tenant)
        assert throttle_list(conn, tenant_id=other) == []  # another tenant's endpoint
    assert shown.destination == "virus_scan endpoint_id=a" and shown.rate_now == 0


async def test_idle_buckets_are_pruned_and_recent_ones_kept(engine, aengine, tenant, claim):
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind="virus_scan", rate="1/min", burst=4, key="domain")
    for n in range(30):
        jobs(engine, tenant, 1, domain=f"d{n}.example")
    assert len(await claim()) == 30
    shift(engine, 200.0)  # under the 240 s a bucket takes to refill from empty to its burst
    jobs(engine, tenant, 1, domain="fresh.example")
    assert len(await claim()) == 1
    assert (await FlowKeeper(aengine).run_once()).buckets_pruned == 0
    shift(engine, 100.0)
    assert (await FlowKeeper(aengine).run_once()).buckets_pruned == 30
    with engine.connect() as conn:
        left = conn.execute(text("SELECT key FROM mdm.aa_job_limit_bucket")).scalars().all()
    assert left == ["fresh.example"]


async def test_a_limit_of_a_job_in_ages_keeps_its_bucket_and_maintenance_running(
        engine, aengine, tenant, claim):
    """A bucket of 1e-19 jobs a second refills in 3e11 years: as an interval before now,
    that overflowed the timestamp, and every maintenance round failed on it."""
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind="virus_scan", rate=1e-19, burst=1)
    jobs(engine, tenant, 2)
    assert len(await claim()) == 1
    shift(engine, 10 * 365 * 86400.0)
    assert (await FlowKeeper(aengine).run_once()).buckets_pruned == 0
    assert await claim() == []  # the bucket is still empty
