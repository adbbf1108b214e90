"""Fair claiming (sql/claim.sql, job_claim_fair) on a real PostgreSQL: within the most urgent
priority level a claim is shared across the tenants with due work, by weight; priority
still comes first; without fairness the claim is strictly by priority and due time."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from postrelay.queue import ensure_tenant, pause, queries, resume
from postrelay.queue.queries import JOB_SQL, FairShares


@pytest.fixture
async def claim(database_url):
    """Claims as a worker does, returning the claimed jobs' tenants, counted."""
    engine = create_async_engine(database_url, isolation_level="AUTOCOMMIT")

    async def run(demand: int, fair: FairShares | None = FairShares.of(), **filters):
        async with engine.connect() as conn:
            jobs = await queries.job_claim(
                conn, worker="w", demand=demand, tenant_ids=filters.get("tenant_ids"),
                kinds=filters.get("kinds"), fair=fair, fair_start=filters.get("fair_start"))
        return jobs

    yield run
    await engine.dispose()


def backlog(engine, tenant_id, n: int, *, priority: int = 100, kind: str = "reindex",
            ago_secs: float = 60.0) -> None:
    """`n` pending jobs, due since `ago_secs`, oldest first by a millisecond each."""
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, priority, available_at) "
            "SELECT :t, CAST(:kind AS mdm.job_kind), '{}', :p, "
            "       now() - make_interval(secs => :ago) + g * interval '1 millisecond' "
            "FROM generate_series(1, :n) AS g"),
            {"t": tenant_id, "kind": kind, "p": priority, "ago": ago_secs, "n": n})
        conn.execute(text("ANALYZE mdm.aa_job"))


def tenants(engine, n: int) -> list[uuid.UUID]:
    with engine.begin() as conn:
        return [ensure_tenant(conn, f"t{i:04}") for i in range(n)]


def by_tenant(jobs) -> Counter:
    return Counter(job.tenant_id for job in jobs)


async def test_one_job_of_b_behind_20000_of_a_is_in_the_next_claim_only_when_fair(
        engine, tenant, claim):
    with engine.begin() as conn:
        b = ensure_tenant(conn, "globex")
    backlog(engine, tenant, 20_000, ago_secs=120)
    backlog(engine, b, 1, ago_secs=1)  # due after every one of A's
    unfair = await claim(10, fair=None)
    assert by_tenant(unfair) == {tenant: 10}
    fair = await claim(10)
    assert by_tenant(fair) == {tenant: 9, b: 1}  # B's one job; A's take the rest


async def test_a_claim_is_shared_evenly_and_by_weight(engine, tenant, claim):
    a = tenant
    with engine.begin() as conn:
        b = ensure_tenant(conn, "globex")
    backlog(engine, a, 500, ago_secs=120)
    backlog(engine, b, 500, ago_secs=60)
    assert by_tenant(await claim(40)) == {a: 20, b: 20}
    assert by_tenant(await claim(40, fair=FairShares.of({a: 3}))) == {a: 30, b: 10}


async def test_priority_still_comes_first(engine, tenant, claim):
    with engine.begin() as conn:
        b = ensure_tenant(conn, "globex")
    backlog(engine, tenant, 50, priority=10, ago_secs=1)
    backlog(engine, b, 50, priority=100, ago_secs=120)  # older, but less urgent
    assert by_tenant(await claim(20)) == {tenant: 20}
    # What the urgent level cannot fill goes to the next level, still by due time.
    assert by_tenant(await claim(40)) == {tenant: 30, b: 10}


async def test_more_tenants_than_a_claim_serves_are_all_served_in_turn(engine, clean_db,
                                                                      claim):
    ids = tenants(engine, 30)
    for t in ids:
        backlog(engine, t, 20)
    served: Counter = Counter()
    for _ in range(30):
        jobs = await claim(10)
        counts = by_tenant(jobs)
        assert len(jobs) == 10 and set(counts.values()) == {1}  # ten tenants, one each
        served.update(counts)
    # 300 jobs over 30 tenants by random rounds: every tenant served, none starved.
    assert set(served) == set(ids)


async def test_fair_claims_skip_paused_tenants_and_keep_to_the_workers_filters(
        engine, tenant, claim):
    with engine.begin() as conn:
        b = ensure_tenant(conn, "globex")
        c = ensure_tenant(conn, "initech")
        pause(conn, actor="test", tenant_id=b)
    for t in (tenant, b, c):
        backlog(engine, t, 20)
        backlog(engine, t, 20, kind="bulk_import")
    jobs = await claim(30, kinds=["bulk_import"])
    assert by_tenant(jobs) == {tenant: 15, c: 15} and {j.kind for j in jobs} == {"bulk_import"}
    only_c = await claim(30, tenant_ids=[c])
    assert by_tenant(only_c) == {c: 25}  # its 20 reindex and 5 bulk_import left


async def test_a_fair_claim_takes_no_job_twice_and_locks_no_more_than_it_claims(
        engine, tenant, claim):
    with engine.begin() as conn:
        b = ensure_tenant(conn, "globex")
    backlog(engine, tenant, 30)
    backlog(engine, b, 3)
    seen: list[uuid.UUID] = []
    while jobs := await claim(7):
        assert len(jobs) <= 7
        seen += [j.id for j in jobs]
    assert len(seen) == len(set(seen)) == 33


async def test_claims_of_one_job_serve_the_tenants_in_turn(engine, tenant, claim):
    with engine.begin() as conn:
        b = ensure_tenant(conn, "globex")
        c = ensure_tenant(conn, "initech")
    backlog(engine, tenant, 100, ago_secs=120)  # the oldest: tenant's job is always the seed
    backlog(engine, b, 100, ago_secs=60)
    backlog(engine, c, 100, ago_secs=60)
    start = uuid.uuid4()
    served = []
    for _ in range(9):
        jobs = await claim(1, fair_start=start)
        served.append(jobs[0].tenant_id)
        start = queries.next_fair_start(start, jobs)
    # Round robin: each tenant once in every three claims.
    assert Counter(served) == {tenant: 3, b: 3, c: 3}
    assert all(len(set(served[i:i + 3])) == 3 for i in range(0, 9, 3))


def claimed_by_plain_claim(engine, *, fair: bool) -> int:
    """How many jobs job_claim takes (rolled back), fair check on or off."""
    with engine.connect() as conn:
        rows = conn.execute(JOB_SQL["job_claim"], {
            "worker": "w", "demand": 5, "tenant_ids": None, "kinds": None, "fair": fair,
        }).fetchall()
        conn.rollback()
    return len(rows)


async def test_the_plain_claim_gives_way_only_when_another_tenant_waits_at_its_level(
        engine, tenant, claim):
    with engine.begin() as conn:
        b = ensure_tenant(conn, "globex")
    backlog(engine, tenant, 20, priority=10)
    assert claimed_by_plain_claim(engine, fair=True) == 5  # one tenant: nothing to share
    backlog(engine, b, 3, priority=100)  # less urgent
    backlog(engine, b, 3, priority=10, ago_secs=-3600)  # not yet due
    assert claimed_by_plain_claim(engine, fair=True) == 5
    backlog(engine, b, 3, priority=10)
    with engine.begin() as conn:
        pause(conn, actor="test", tenant_id=b)
    assert claimed_by_plain_claim(engine, fair=True) == 5  # B's due work is paused
    with engine.begin() as conn:
        resume(conn, actor="test", tenant_id=b)
    # B waits at A's level: job_claim claims nothing, and the worker's claim shares.
    assert claimed_by_plain_claim(engine, fair=True) == 0
    assert claimed_by_plain_claim(engine, fair=False) == 5
    assert by_tenant(await claim(6)) == {tenant: 3, b: 3}
