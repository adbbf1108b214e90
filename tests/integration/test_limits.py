"""Rate and concurrency limits (queue/limits.py) on a real PostgreSQL: what a limited
claim (sql/limited.sql, job_claim_limited) takes, per kind, tenant and payload key, and bad
input refused with nothing written. Time is moved by rewriting a bucket's refill time,
never by sleeping."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from postrelay.core.errors import NotFoundError, ValidationError
from postrelay.queue import (
    ensure_tenant,
    limit_list,
    limit_remove,
    limit_set,
    parse_rate,
    pause,
    queries,
)
from tests.factories import insert_job

ACTOR = "test:ops"


@pytest.fixture
async def claim(database_url):
    engine = create_async_engine(database_url, isolation_level="AUTOCOMMIT")

    async def run(demand: int = 50, kinds=("virus_scan",)):
        async with engine.connect() as conn:
            return await queries.job_claim_limited(conn, worker="w", demand=demand,
                                                   tenant_ids=None, kinds=list(kinds))

    yield run
    await engine.dispose()


def jobs(engine, tenant_id, n: int, kind: str = "virus_scan", **payload) -> list[uuid.UUID]:
    with engine.begin() as conn:
        return [insert_job(conn, tenant_id=tenant_id, kind=kind, payload=dict(payload))
                for _ in range(n)]


def finish(engine, ids) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_job SET status = 'done', completed_at = now() "
                          "WHERE id = ANY(:ids)"), {"ids": list(ids)})


def age_buckets(engine, secs: float) -> None:
    """As if `secs` had passed since every bucket was last drawn."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_job_limit_bucket "
                          "SET refilled_at = refilled_at - make_interval(secs => :s)"),
                     {"s": secs})


@pytest.mark.parametrize("given, per_sec", [("14/s", 14.0), ("1000/min", 1000 / 60),
                                            ("3600 / h", 1.0), ("0.5/sec", 0.5), (2, 2.0)])
def test_rates_parse(given, per_sec):
    assert parse_rate(given) == pytest.approx(per_sec)


async def test_a_concurrency_cap_counts_running_jobs_of_every_worker(engine, tenant, claim):
    jobs(engine, tenant, 6)
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind="virus_scan", concurrency=2)
    first = await claim()
    assert len(first) == 2
    assert await claim() == []  # two running: the cap holds, whoever claims
    finish(engine, [first[0].id])
    assert len(await claim()) == 1


async def test_a_rate_takes_the_burst_then_what_the_bucket_refills(engine, tenant, claim):
    jobs(engine, tenant, 30)
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind="virus_scan", rate="1/s", burst=3)
    assert len(await claim()) == 3  # a new bucket is full
    assert await claim() == []  # empty: a token takes a second
    age_buckets(engine, 2.0)
    assert len(await claim()) == 2
    age_buckets(engine, 60.0)
    assert len(await claim()) == 3  # never more than the burst


async def test_a_key_gives_each_payload_value_its_own_limit(engine, tenant, claim):
    jobs(engine, tenant, 5, domain="a.example")
    jobs(engine, tenant, 5, domain="b.example")
    jobs(engine, tenant, 5)  # no domain: the key '' is a value of its own
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind="virus_scan", concurrency=2, key="domain")
    got = await claim()
    assert Counter(j.payload.get("domain") for j in got) == {"a.example": 2, "b.example": 2,
                                                             None: 2}
    assert await claim() == []


async def test_a_tenants_own_limit_governs_its_jobs_and_the_kinds_the_rest(engine, tenant,
                                                                          claim):
    with engine.begin() as conn:
        other = ensure_tenant(conn, "globex")
        limit_set(conn, actor=ACTOR, kind="virus_scan", concurrency=1)
        limit_set(conn, actor=ACTOR, kind="virus_scan", tenant_id=other, concurrency=3)
    jobs(engine, tenant, 5)
    jobs(engine, other, 5)
    got = Counter(j.tenant_id for j in await claim())
    assert got == {tenant: 1, other: 3}
    assert await claim() == []


async def test_a_kind_wide_limit_removes_the_limits_tenant_keys_set_on_the_kind(
        engine, tenant, claim):
    """A tenant's own limit governs its jobs instead of the kind-wide one: one that a tenant
    key set before the operator limited the kind kept its jobs out of that limit."""
    with engine.begin() as conn:
        other = ensure_tenant(conn, "globex")
        limit_set(conn, actor="api:key:acme-ci", kind="virus_scan", tenant_id=tenant,
                  concurrency=1000)
        limit_set(conn, actor="dashboard:key:acme", kind="reindex", tenant_id=tenant,
                  rate="5/s")
        limit_set(conn, actor=ACTOR, kind="virus_scan", tenant_id=other, concurrency=3)
        limit_set(conn, actor=ACTOR, kind="virus_scan", concurrency=1)
        kept = limit_list(conn)
    assert [(lim.kind, lim.tenant_id, lim.created_by) for lim in kept] == [
        ("reindex", tenant, "dashboard:key:acme"),  # another kind
        ("virus_scan", None, ACTOR),
        ("virus_scan", other, ACTOR)]  # what the operator set within a tenant stays
    jobs(engine, tenant, 5)
    jobs(engine, other, 5)
    assert Counter(j.tenant_id for j in await claim()) == {tenant: 1, other: 3}
    with engine.connect() as conn:
        removed = conn.execute(text(
            "SELECT tenant_id, actor, detail->>'created_by', detail->>'reason' "
            "FROM mdm.aa_flow_audit WHERE action = 'limit_removed'")).all()
    assert [tuple(row) for row in removed] == [(tenant, ACTOR, "api:key:acme-ci",
                                                "kind_wide_limit")]


async def test_limited_claims_skip_paused_jobs_and_unlimited_tenants_go_free(
        engine, tenant, claim):
    with engine.begin() as conn:
        other = ensure_tenant(conn, "globex")
        limit_set(conn, actor=ACTOR, kind="virus_scan", tenant_id=other, concurrency=1)
    jobs(engine, tenant, 4)
    jobs(engine, other, 4)
    got = Counter(j.tenant_id for j in await claim())
    assert got == {tenant: 4, other: 1}  # only globex's jobs are limited
    jobs(engine, tenant, 2)
    with engine.begin() as conn:
        pause(conn, actor=ACTOR, tenant_id=tenant)
    assert await claim() == []


@pytest.mark.parametrize("args, field", [
    ({"kind": "no_such_kind", "rate": "5/s"}, "kind"),
    ({"kind": "virus_scan", "rate": "5/s", "tenant_id": uuid.uuid4()}, "tenant_id"),
    ({"kind": "virus_scan", "rate": "0/s"}, "rate"),
    ({"kind": "virus_scan", "rate": "-3/s"}, "rate"),
    ({"kind": "virus_scan", "rate": "fast"}, "rate"),
    ({"kind": "virus_scan", "rate": "5/fortnight"}, "rate"),
    ({"kind": "virus_scan", "rate": 0}, "rate"),
    ({"kind": "virus_scan"}, "rate"),
    ({"kind": "virus_scan", "burst": 5, "concurrency": 2}, "burst"),
    ({"kind": "virus_scan", "rate": "5/s", "burst": 0}, "burst"),
    ({"kind": "virus_scan", "concurrency": 0}, "concurrency"),
    ({"kind": "virus_scan", "concurrency": 2, "key": "a..b"}, "key"),
    ({"kind": "virus_scan", "concurrency": 2, "key": "to'); DROP"}, "key"),
])
def test_bad_input_names_the_field_and_writes_nothing(engine, tenant, args, field):
    with engine.begin() as conn, pytest.raises(ValidationError) as info:
        limit_set(conn, actor=ACTOR, **args)
    assert info.value.field == field
    with engine.connect() as conn:
        assert limit_list(conn) == []
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_flow_audit")).scalar_one() == 0


def test_set_replaces_list_shows_and_remove_deletes_with_audit_rows(engine, tenant):
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind="email_send", rate="14/s")
        again = limit_set(conn, actor=ACTOR, kind="email_send", rate="1000/min", burst=50,
                          concurrency=5, key="recipient.domain")
        mine = limit_set(conn, actor=ACTOR, kind="email_send", tenant_id=tenant,
                         concurrency=1)
        listed = limit_list(conn)
    assert again.burst == 50 and again.key == "recipient.domain"
    assert again.rate_per_sec == pytest.approx(1000 / 60)
    assert [(lim.kind, lim.tenant_id) for lim in listed] == [("email_send", None),
                                                             ("email_send", tenant)]
    assert mine.describe() == (
        f"kind email_send, tenant {tenant}: at most 1 running")
    with engine.begin() as conn:
        limit_remove(conn, actor=ACTOR, kind="email_send")
        with pytest.raises(NotFoundError):
            limit_remove(conn, actor=ACTOR, kind="email_send")
        assert [lim.tenant_id for lim in limit_list(conn)] == [tenant]
    with engine.connect() as conn:
        actions = conn.execute(text("SELECT action FROM mdm.aa_flow_audit ORDER BY id")).all()
    assert [a for (a,) in actions] == ["limit_set"] * 3 + ["limit_removed"]


async def test_the_slowest_rate_allowed_claims_without_an_underflow(engine, tenant, claim):
    """Below 1e-100/s the refill underflowed (PostgreSQL raises) and the limited claim
    failed for every kind it serves; at the floor it takes the burst and then waits."""
    refused = pytest.raises(ValidationError, match="rate: must be at least 1e-100/s")
    with refused, engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind="virus_scan", rate=5e-324)
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind="virus_scan", rate=1e-100)
        limit_set(conn, actor=ACTOR, kind="index_sync", rate="100/s")
    jobs(engine, tenant, 2)
    other = jobs(engine, tenant, 2, kind="index_sync")
    first = await claim(kinds=("virus_scan", "index_sync"))
    assert len([j for j in first if j.id in other]) == 2 and len(first) == 3
    for _ in range(3):  # the bucket drawn, a few microseconds and more idle
        assert await claim(kinds=("virus_scan", "index_sync")) == []
    age_buckets(engine, 0.5)
    assert await claim(kinds=("virus_scan", "index_sync")) == []
