"""A limited claim (sql/limited.sql, job_claim_limited) shared across tenants, on a real
PostgreSQL: one tenant's limit, or its backlog behind a kind-wide limit, holds back only its
own jobs. Another tenant's due jobs are claimed beside it, however many of the first
tenant's jobs wait ahead of them, whatever their priorities; within a priority level the
allowance of a kind-wide limit goes round the tenants, by their weights."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from postrelay.queue import ensure_tenant, limit_set, queries
from postrelay.queue.queries import FairShares

ACTOR = "test:ops"
KIND = "virus_scan"


@pytest.fixture
async def claim(database_url):
    engine = create_async_engine(database_url, isolation_level="AUTOCOMMIT")

    async def run(demand: int = 10, fair: FairShares | None = FairShares.of(),
                  start: uuid.UUID | None = None):
        async with engine.connect() as conn:
            return await queries.job_claim_limited(conn, worker="w", demand=demand,
                                                   tenant_ids=None, kinds=[KIND], fair=fair,
                                                   fair_start=start)

    yield run
    await engine.dispose()


@pytest.fixture
def other(engine, tenant) -> uuid.UUID:
    with engine.begin() as conn:
        return ensure_tenant(conn, "globex")


def backlog(engine, tenant_id, n: int, *, priority: int = 100, age_secs: float = 0.0) -> None:
    """n due jobs, the oldest `age_secs` + n ms ago, one statement."""
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, priority, available_at) "
            "SELECT :t, CAST(:k AS mdm.job_kind), '{}', :p, "
            "       now() - make_interval(secs => :age + (:n - i) / 1000.0) "
            "FROM generate_series(1, :n) AS i"),
            {"t": tenant_id, "k": KIND, "p": priority, "n": n, "age": age_secs})


def by_tenant(jobs) -> Counter:
    return Counter(job.tenant_id for job in jobs)


async def test_a_tenants_own_limit_holds_back_no_other_tenants_jobs(engine, tenant, other,
                                                                    claim):
    """The backlog of a tenant at its own limit, older than another tenant's jobs and more
    than the claim's 1,000 candidates, does not hide them."""
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind=KIND, tenant_id=tenant, concurrency=1)
    backlog(engine, tenant, 1_200, age_secs=60)
    backlog(engine, other, 3)
    assert by_tenant(await claim()) == {tenant: 1, other: 3}
    assert by_tenant(await claim()) == {}  # the one running holds the rest back


async def test_nor_from_a_more_urgent_priority(engine, tenant, other, claim):
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind=KIND, tenant_id=tenant, concurrency=1)
    for priority in (-100, 0, 100):  # three levels ahead of the other tenant's
        backlog(engine, tenant, 400, priority=priority, age_secs=60)
    backlog(engine, other, 3, priority=200)
    assert by_tenant(await claim()) == {tenant: 1, other: 3}


async def test_a_kind_wide_allowance_goes_round_the_tenants(engine, tenant, other, claim):
    """Behind one limit for every tenant (POSTRELAY_SMTP_RATE makes one), the tenant with
    the older backlog does not take the whole allowance: within a priority level the
    claim alternates between the tenants."""
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind=KIND, rate="4/s")  # a bucket of 4 to start
    backlog(engine, tenant, 1_500, age_secs=60)
    backlog(engine, other, 5)
    assert by_tenant(await claim()) == {tenant: 2, other: 2}


async def test_by_their_weights(engine, tenant, other, claim):
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind=KIND, rate="4/s")
    backlog(engine, tenant, 50, age_secs=60)
    backlog(engine, other, 50)
    assert by_tenant(await claim(fair=FairShares.of({other: 3}))) == {tenant: 1, other: 3}


async def test_a_more_urgent_level_still_goes_first(engine, tenant, other, claim):
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind=KIND, rate="4/s")
    backlog(engine, tenant, 10, priority=200, age_secs=60)
    backlog(engine, other, 10, priority=50)
    assert by_tenant(await claim()) == {other: 4}


async def test_without_fair_claiming_the_oldest_take_the_allowance(engine, tenant, other,
                                                                  claim):
    """POSTRELAY_FAIR_CLAIMING off: priority, then due time, as a plain claim."""
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind=KIND, rate="4/s")
    backlog(engine, tenant, 50, age_secs=60)
    backlog(engine, other, 5)
    assert by_tenant(await claim(fair=None)) == {tenant: 4}
