"""Pausing and resuming (queue/pauses.py) on a real PostgreSQL: the claim takes nothing a
pause matches, paused jobs keep their state, and bad input writes nothing."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from postrelay.core.errors import ForbiddenError, NotFoundError, ValidationError
from postrelay.queue import ensure_tenant, pause, pause_list, queries, resume
from tests.factories import insert_job

ACTOR = "test:ops"


@pytest.fixture
async def claim(database_url):
    """Claims as a worker does (every tenant, every kind), returning the claimed ids."""
    engine = create_async_engine(database_url, isolation_level="AUTOCOMMIT")

    async def run(demand: int = 100) -> set[uuid.UUID]:
        async with engine.connect() as conn:
            jobs = await queries.job_claim(conn, worker="w", demand=demand, tenant_ids=None,
                                           kinds=None)
        return {job.id for job in jobs}

    yield run
    await engine.dispose()


@pytest.fixture
def two_tenants(engine, tenant):
    with engine.begin() as conn:
        return tenant, ensure_tenant(conn, "globex")


def jobs(engine, tenant_id, kind, n=2, **fields) -> set[uuid.UUID]:
    with engine.begin() as conn:
        return {insert_job(conn, tenant_id=tenant_id, kind=kind, **fields) for _ in range(n)}


def flow_audit(engine) -> list[tuple]:
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT action, tenant_id, job_kind::text, actor FROM mdm.aa_flow_audit "
            "ORDER BY id")).all()


@pytest.mark.parametrize("scope, claimable", [
    ({"kind": "reindex"}, {("a", "bulk_import"), ("b", "bulk_import")}),
    ({"tenant": "a"}, {("b", "reindex"), ("b", "bulk_import")}),
    ({"kind": "reindex", "tenant": "a"},
     {("a", "bulk_import"), ("b", "reindex"), ("b", "bulk_import")}),
    ({"everything": True}, set()),
])
async def test_a_paused_scope_is_not_claimed_and_the_rest_is(engine, two_tenants, claim,
                                                             scope, claimable):
    a, b = two_tenants
    names = {a: "a", b: "b"}
    made = {(names[t], k): jobs(engine, t, k) for t in (a, b) for k in ("reindex", "bulk_import")}
    tenant = {"a": a, "b": b}.get(scope.get("tenant"))
    with engine.begin() as conn:
        paused, created = pause(conn, actor=ACTOR, kind=scope.get("kind"), tenant_id=tenant,
                                everything=scope.get("everything", False))
    assert created and paused.paused_by == ACTOR

    claimed = await claim()
    assert claimed == set().union(*(made[c] for c in claimable))
    # The paused jobs stay pending, with their attempts, and are claimed once resumed.
    held = set().union(*made.values()) - claimed
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status::text, attempts FROM mdm.aa_job "
                                 "WHERE id = ANY(:ids)"), {"ids": list(held)}).all()
    assert rows and set(rows) == {("pending", 0)}
    with engine.begin() as conn:
        resume(conn, actor=ACTOR, kind=scope.get("kind"), tenant_id=tenant,
               everything=scope.get("everything", False))
    assert await claim() == held
    assert [r[0] for r in flow_audit(engine)] == ["paused", "resumed"]


async def test_a_paused_job_does_not_count_as_due(engine, async_engine, tenant):
    # Else an idle worker would be told a job is due now, claim nothing, and spin.
    jobs(engine, tenant, "reindex", n=1)
    with engine.begin() as conn:
        pause(conn, actor=ACTOR, kind="reindex")
    async with async_engine.connect() as conn:
        assert await queries.job_next_due_in(conn, tenant_ids=None, kinds=None) is None
    with engine.begin() as conn:
        resume(conn, actor=ACTOR, kind="reindex")
    async with async_engine.connect() as conn:
        assert await queries.job_next_due_in(conn, tenant_ids=None, kinds=None) < 0


def test_pausing_twice_keeps_the_first_pause_and_one_audit_row(engine, tenant):
    with engine.begin() as conn:
        first, created = pause(conn, actor="ops:alice", kind="reindex", tenant_id=tenant)
    with engine.begin() as conn:
        again, created_again = pause(conn, actor="ops:bob", kind="reindex", tenant_id=tenant)
    assert created and not created_again
    assert again == first and again.paused_by == "ops:alice"
    assert flow_audit(engine) == [("paused", tenant, "reindex", "ops:alice")]


def test_resume_lifts_only_its_own_scope(engine, tenant):
    with engine.begin() as conn:
        pause(conn, actor=ACTOR, kind="reindex")
        pause(conn, actor=ACTOR, kind="reindex", tenant_id=tenant)
        resume(conn, actor="ops:bob", kind="reindex")
        left = pause_list(conn)
    assert [(p.tenant_id, p.kind) for p in left] == [(tenant, "reindex")]
    with engine.connect() as conn:
        detail = conn.execute(text("SELECT detail FROM mdm.aa_flow_audit "
                                   "WHERE action = 'resumed'")).scalar_one()
    assert detail["paused_by"] == ACTOR and detail["paused_at"]


def test_the_list_for_a_tenant_shows_its_own_and_installation_wide_pauses_only(
        engine, two_tenants):
    a, b = two_tenants
    with engine.begin() as conn:
        pause(conn, actor=ACTOR, everything=True)
        pause(conn, actor=ACTOR, kind="email_send")
        pause(conn, actor=ACTOR, tenant_id=a)
        pause(conn, actor=ACTOR, tenant_id=b, kind="reindex")
        seen_by_a = {(p.tenant_id, p.kind) for p in pause_list(conn, tenant_id=a)}
        every = pause_list(conn)
    assert seen_by_a == {(None, None), (None, "email_send"), (a, None)}
    assert len(every) == 4


@pytest.mark.parametrize("args, field", [
    ({"kind": "no_such_kind"}, "kind"),
    ({"tenant_id": uuid.uuid4()}, "tenant_id"),
    ({"tenant_id": "not-a-uuid"}, "tenant_id"),
    ({}, "scope"),
    ({"kind": "reindex", "everything": True}, "all"),
    ({"kind": "reindex", "actor": " "}, "actor"),
])
def test_bad_input_names_the_field_and_writes_nothing(engine, tenant, args, field):
    args = {"actor": ACTOR, **args}
    for call in (pause, resume):
        with engine.begin() as conn, pytest.raises(ValidationError) as info:
            call(conn, **args)
        assert info.value.field == field
    with engine.connect() as conn:
        assert pause_list(conn) == []
    assert flow_audit(engine) == []


def test_resuming_what_is_not_paused_is_not_found(engine, tenant):
    with engine.begin() as conn, pytest.raises(NotFoundError, match="kind reindex"):
        resume(conn, actor=ACTOR, kind="reindex")
    assert flow_audit(engine) == []


def test_a_tenant_keys_resume_never_lifts_a_pause_the_operator_made_meanwhile(engine, tenant):
    """The API checks who paused a scope and then resumes it, in one transaction but two
    statements: an operator's pause (or take-over of the key's) that commits in between
    was deleted by the key's resume until the delete itself judged who paused the row."""
    key = "api:key:acme-app"
    with engine.begin() as conn:
        pause(conn, actor=key, kind="reindex", tenant_id=tenant)
    with engine.connect() as keys, keys.begin():
        assert [p.paused_by for p in pause_list(keys, tenant_id=tenant)] == [key]  # checked
        with engine.begin() as ops:
            pause(ops, actor=ACTOR, kind="bulk_import", tenant_id=tenant)
        with pytest.raises(ForbiddenError) as refused:
            resume(keys, actor="dashboard:key:acme-app", kind="bulk_import", tenant_id=tenant)
        assert refused.value.code == "operator_pause"
        with engine.begin() as ops:
            assert pause(ops, actor=ACTOR, kind="reindex", tenant_id=tenant)[0].paused_by == ACTOR
        with pytest.raises(ForbiddenError):
            resume(keys, actor=key, kind="reindex", tenant_id=tenant)
    with engine.connect() as conn:
        assert {(p.kind, p.paused_by) for p in pause_list(conn)} == {
            ("reindex", ACTOR), ("bulk_import", ACTOR)}
    assert [(action, actor) for action, _, _, actor in flow_audit(engine)] == [
        ("paused", key), ("paused", ACTOR), ("paused", ACTOR)]
