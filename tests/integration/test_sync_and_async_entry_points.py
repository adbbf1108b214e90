"""Each write that joins the caller's transaction has a sync entry point and an async one
over the same steps (`enqueue` / `enqueue_async`, ...). The sync one given an async
connection still returns the awaitable, for a deprecation period, and warns naming the async
function; an async one given a sync connection is refused at the call."""

from __future__ import annotations

import warnings

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

import postrelay.queue as pq
import postrelay.relay as relay
from postrelay.orchestrator import EmailJob, enqueue_email, enqueue_email_async
from tests.factories import scalar

MESSAGE = EmailJob("welcome", ("ann@example.com",), sender="shop@example.com")


def jobs(engine) -> int:
    return scalar(engine, "SELECT count(*) FROM mdm.aa_job")


def events(engine) -> int:
    return scalar(engine, "SELECT count(*) FROM mdm.aa_outbox_event")


async def test_the_async_entry_points_write_in_the_callers_transaction(
    async_engine, engine, tenant
):
    async with async_engine.begin() as conn:
        job_id = await pq.enqueue_async(conn, "reindex", {"n": 1}, tenant_id=tenant)
        many = await pq.enqueue_many_async(conn, [pq.JobSpec("reindex", {"n": 2}, tenant)])
        event_id = await relay.emit_async(conn, "order.placed", {"n": 3}, tenant_id=tenant,
                                          aggregate_type="order", aggregate_id=3)
        more = await relay.emit_many_async(conn, [relay.EventSpec(
            "order.placed", {"n": 4}, tenant, "order", "4")])
        email_id = await enqueue_email_async(conn, MESSAGE, tenant_id=tenant)
        other = await pq.ensure_tenant_async(conn, "globex")
        kinds = await pq.job_kinds_async(conn)
    assert jobs(engine) == 3 and events(engine) == 2
    assert len({job_id, *many, email_id}) == 3 and len({event_id, *more}) == 2
    assert scalar(engine, "SELECT name FROM mdm.aa_tenant WHERE id = :i", i=other) == "globex"
    assert "reindex" in kinds and "email_send" in kinds


async def test_the_async_entry_points_take_a_session_and_psycopg(
    async_engine, engine, tenant, libpq
):
    async with AsyncSession(async_engine) as session, session.begin():
        await pq.enqueue_async(session, "reindex", {}, tenant_id=tenant)
    async with await psycopg.AsyncConnection.connect(libpq) as conn:
        await relay.emit_async(conn, "order.placed", {}, tenant_id=tenant,
                               aggregate_type="order", aggregate_id=1)
        await conn.rollback()  # the caller's transaction decides: nothing is left
    assert jobs(engine) == 1 and events(engine) == 0


async def test_an_async_entry_point_refuses_a_sync_connection(engine, tenant):
    with engine.begin() as conn:
        with pytest.raises(TypeError, match="conn: expected an async"):
            await pq.enqueue_async(conn, "reindex", {}, tenant_id=tenant)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="conn: expected an async"):
            await relay.emit_many_async(conn, [])  # type: ignore[arg-type]
    assert jobs(engine) == 0


@pytest.mark.parametrize(
    ("call", "async_name", "table"),
    [
        (lambda c, t: pq.enqueue(c, "reindex", {}, tenant_id=t), "enqueue_async", "aa_job"),
        (lambda c, t: pq.enqueue_many(c, [pq.JobSpec("reindex", {}, t)]),
         "enqueue_many_async", "aa_job"),
        (lambda c, t: relay.emit(c, "order.placed", {}, tenant_id=t, aggregate_type="order",
                                 aggregate_id=1), "emit_async", "aa_outbox_event"),
        (lambda c, t: relay.emit_many(c, [relay.EventSpec("order.placed", {}, t, "order", "1")]),
         "emit_many_async", "aa_outbox_event"),
        (lambda c, t: enqueue_email(c, MESSAGE, tenant_id=t), "enqueue_email_async", "aa_job"),
        (lambda c, t: pq.ensure_tenant(c, "initech"), "ensure_tenant_async", "aa_tenant"),
    ],
    ids=["enqueue", "enqueue_many", "emit", "emit_many", "enqueue_email", "ensure_tenant"],
)
async def test_the_old_form_on_an_async_connection_warns_and_still_writes(
    async_engine, engine, tenant, call, async_name, table
):
    before = scalar(engine, f"SELECT count(*) FROM mdm.{table}")
    async with async_engine.begin() as conn:
        with pytest.warns(DeprecationWarning, match=f"await {async_name}\\(conn") as caught:
            await call(conn, tenant)
    # The warning points at the caller's line, not at postrelay's insides.
    assert all(w.filename == __file__ for w in caught)
    assert scalar(engine, f"SELECT count(*) FROM mdm.{table}") == before + 1


async def test_job_kinds_the_old_way_warns_and_still_answers(async_engine):
    async with async_engine.connect() as conn:
        with pytest.warns(DeprecationWarning, match="await job_kinds_async"):
            kinds = await pq.job_kinds(conn)
    assert "email_send" in kinds


def test_the_sync_entry_points_do_not_warn(engine, tenant):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with engine.begin() as conn:
            pq.enqueue(conn, "reindex", {}, tenant_id=tenant)
            relay.emit(conn, "order.placed", {}, tenant_id=tenant, aggregate_type="order",
                       aggregate_id=1)
            assert "reindex" in pq.job_kinds(conn)
            conn.execute(text("SELECT 1"))
    assert jobs(engine) == 1 and events(engine) == 1
