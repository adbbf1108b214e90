"""The checks of concurrent attempts share one read, one refused row fails only its own
attempt, and the read writes nothing."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy import text

from postrelay.core.errors import ValidationError
from postrelay.orchestrator import claimed, sending
from postrelay.orchestrator.claimed import ClaimedJobs
from postrelay.orchestrator.sending import SendCheckBatcher
from postrelay.queue.model import Job


def check_row(tenant: uuid.UUID, job_id: uuid.UUID | str) -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "tenant_id": str(tenant), "job_id": str(job_id),
            "template": "welcome", "category": None,
            "recipients": [f"{job_id}@example.com"], "attempt": 1}


def log_rows(engine) -> int:  # noqa: ANN001
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM mdm.aa_email_log")).scalar_one()


async def test_concurrent_attempts_share_one_round_trip(rig, tenant, async_engine, engine):
    jobs = [rig.enqueue(tenant) for _ in range(20)]
    batcher = SendCheckBatcher(async_engine)
    checks = await asyncio.gather(*(batcher.check(check_row(tenant, j)) for j in jobs))
    assert all(not c.logged and not c.rescues and not c.already_sent and not c.suppressions
               for c in checks)
    assert log_rows(engine) == 0  # a read: the log row comes with the outcome
    assert batcher.round_trips <= 2  # one by one would be 20
    await batcher.close()


async def test_a_busy_read_waits_for_company_until_half_the_slots_wait(
        rig, tenant, async_engine, monkeypatch):
    monkeypatch.setattr(sending, "LINGER_SECS", 30.0)  # only company can end the wait
    batcher = SendCheckBatcher(async_engine, concurrency=4)
    first = [batcher.check(check_row(tenant, rig.enqueue(tenant))) for _ in range(3)]
    await asyncio.gather(*first)  # one read of three: the batcher is busy now

    alone = asyncio.create_task(batcher.check(check_row(tenant, rig.enqueue(tenant))))
    await asyncio.sleep(0.3)
    assert not alone.done()  # one of four slots waiting: the read waits for more
    second = asyncio.create_task(batcher.check(check_row(tenant, rig.enqueue(tenant))))
    await asyncio.wait_for(asyncio.gather(alone, second), timeout=10.0)  # two of four: read
    await batcher.close()


async def test_a_claims_read_is_made_at_once_in_one_round_trip(rig, tenant, async_engine):
    rows = [check_row(tenant, rig.enqueue(tenant)) for _ in range(6)]
    batcher = SendCheckBatcher(async_engine, concurrency=20)  # ten waiting would end a wait
    await batcher.check(rows[0])
    await asyncio.gather(*(batcher.check(row) for row in rows[:3]))  # busy: it would wait
    sending.LINGER_SECS, linger = 30.0, sending.LINGER_SECS
    try:
        checks = await asyncio.wait_for(asyncio.gather(*batcher.start(rows)), timeout=10.0)
    finally:
        sending.LINGER_SECS = linger
    assert [c.already_sent for c in checks] == [False] * 6
    assert batcher.round_trips == 3  # the claim's batch is whole: no wait for company
    await batcher.close()


def claimed_job(job_id: uuid.UUID, tenant: uuid.UUID, payload: dict[str, Any]) -> Job:
    now = datetime.now(UTC)
    return Job(id=job_id, tenant_id=tenant, kind="email_send", payload=payload, priority=100,
               attempts=1, max_attempts=3, available_at=now, claimed_at=now, created_at=now,
               idempotency_key=None)


def parse(job: Job) -> tuple[str, list[str]]:
    to = job.payload.get("to")
    if not isinstance(to, str):
        raise ValidationError("to", "must be an address")
    return to, [to]


async def test_a_run_takes_what_its_claim_made_ready_only_while_it_is_fresh(
        rig, tenant, async_engine, engine, monkeypatch):
    """Within EARLY_SECS a run takes the read made at the claim; later it is dropped (a
    recipient may have been suppressed since), and so is what a job that never ran left."""
    batcher = SendCheckBatcher(async_engine)
    ready = ClaimedJobs(batcher, parse)
    fresh, late, never, bad = (claimed_job(rig.enqueue(tenant), tenant,
                                           {"to": f"{name}@example.com"})
                               for name in ("fresh", "late", "never", "bad"))
    bad = claimed_job(bad.id, tenant, {"to": ["not", "a", "string"]})
    ready.claimed([fresh, late, never, bad])
    taken = ready.take(fresh)
    assert taken is not None and taken.parsed == "fresh@example.com"
    assert not (await taken.check).suppressed(None)
    assert ready.take(bad) is None  # its run reads for itself, and fails it
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO mdm.aa_email_suppression (tenant_id, address, reason, "
                          "source) VALUES (:t, 'late@example.com', 'test', 'manual')"),
                     {"t": tenant})
    monkeypatch.setattr(claimed, "EARLY_SECS", 0.0)
    assert ready.take(late) is None
    assert (await batcher.check(check_row(tenant, late.id) | {
        "recipients": ["late@example.com"]})).suppressed(None) == {"late@example.com"}
    ready.claimed([])  # drops what the job that never ran left
    assert ready.take(never) is None and batcher.round_trips == 2
    await batcher.close()


async def test_a_suppression_applies_to_its_own_category_and_to_every_one_when_global(
        rig, tenant, async_engine, engine):
    row = check_row(tenant, rig.enqueue(tenant))
    row["recipients"] = ["news@example.com", "all@example.com", "fine@example.com"]
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO mdm.aa_email_suppression (tenant_id, address, category, "
                          "reason, source) VALUES (:t, 'news@example.com', 'newsletter', 'x', "
                          "'manual'), (:t, 'all@example.com', '', 'x', 'manual')"), {"t": tenant})
    batcher = SendCheckBatcher(async_engine)
    check = await batcher.check(row)
    assert check.suppressed("newsletter") == {"news@example.com", "all@example.com"}
    assert check.suppressed("digest") == {"all@example.com"}
    assert check.suppressed(None) == {"all@example.com"}
    await batcher.close()


async def test_a_refused_row_fails_only_its_own_attempt(rig, tenant, async_engine):
    jobs = [rig.enqueue(tenant) for _ in range(5)]
    batcher = SendCheckBatcher(async_engine)
    rows = [check_row(tenant, j) for j in jobs]
    bad = check_row(tenant, uuid.uuid4())
    bad["tenant_id"] = "acme"  # not a uuid: the database refuses the row
    rows.insert(2, bad)
    results = await asyncio.gather(*(batcher.check(r) for r in rows), return_exceptions=True)
    assert isinstance(results[2], psycopg.errors.InvalidTextRepresentation)
    assert [r.already_sent for i, r in enumerate(results) if i != 2] == [False] * 5
    await batcher.close()


async def test_a_cancelled_attempt_does_not_stop_the_others(rig, tenant, async_engine):
    jobs = [rig.enqueue(tenant) for _ in range(3)]
    batcher = SendCheckBatcher(async_engine)
    tasks = [asyncio.create_task(batcher.check(check_row(tenant, j))) for j in jobs]
    await asyncio.sleep(0)  # every attempt is waiting for the read
    tasks[0].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[0], asyncio.CancelledError)
    assert not done[1].already_sent and not done[2].already_sent
    await batcher.close()


async def test_the_batch_statement_is_planned_once(rig, tenant, async_engine):
    """The worker's pooled connections force custom plans (for job_finalize_many); the
    batcher's own connection keeps one generic plan instead of planning every read."""
    batcher = SendCheckBatcher(async_engine)
    for _ in range(8):  # psycopg prepares a statement on its sixth run
        await batcher.check(check_row(tenant, rig.enqueue(tenant)))
    async with batcher._held.use() as conn:
        cursor = await conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%released_at%'")
        assert await cursor.fetchall() == [(3, 0)]
    await batcher.close()


def test_the_work_per_batch_does_not_grow_with_the_log(tenant, engine, libpq):
    """Earlier attempts, rescues and suppressions are looked up by job and by recipient, so
    the read touches the same few pages however long the log and the audit."""
    from postrelay.core.dbcall import psycopg_sql
    from postrelay.orchestrator.queries import EMAIL_SQL
    from postrelay.queue import JobSpec, enqueue_many

    with engine.begin() as conn:
        old = enqueue_many(conn, [JobSpec("email_send", {}, tenant) for _ in range(3000)])
        fresh = enqueue_many(conn, [JobSpec("email_send", {}, tenant) for _ in range(5)])
    with psycopg.connect(libpq, autocommit=True) as pg:
        pg.execute("""
            INSERT INTO mdm.aa_email_log (tenant_id, job_id, template, from_address,
                recipients, to_addresses, message_id, status, attempt)
            SELECT %(t)s, j, 'welcome', 'noreply@acme.example', ARRAY[j::text || '@x.example'],
                   ARRAY[j::text || '@x.example'], '<' || j::text || '@acme.example>', 'sent', 1
            FROM unnest(%(jobs)s::uuid[]) AS j""", {"t": tenant, "jobs": old})
        pg.execute("""
            INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, actor, detail)
            SELECT j, %(t)s, 'email_send', 'job_rescued', 'w', '{"claimed_by": "w"}'
            FROM unnest(%(jobs)s::uuid[]) AS j""", {"t": tenant, "jobs": old})
        pg.execute("ANALYZE mdm.aa_email_log, mdm.aa_job_audit")
        rows = [check_row(tenant, j) for j in fresh]
        ((plan,),) = pg.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                                + psycopg_sql(EMAIL_SQL["email_send_check_many"]),
                                {"rows": json.dumps(rows)}).fetchall()
    top = plan[0]["Plan"]
    pages = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
    assert pages < 100, f"{pages} pages for a batch of 5 beside 3,000 sent messages"


async def test_the_read_makes_the_claims_before_it_durable(rig, tenant, async_engine, libpq):
    """A claim commits without waiting for the disk; its message must not leave before it
    is durable, and the read before sending flushes the WAL up to itself."""
    batcher = SendCheckBatcher(async_engine)
    with psycopg.connect(libpq, autocommit=True) as pg:
        pg.execute("SET synchronous_commit = off")
        for _ in range(5):  # the WAL writer flushes on its own every 200 ms: five in a row
            job = rig.enqueue(tenant)
            pg.execute("UPDATE mdm.aa_job SET status = 'running' WHERE id = %s", (job,))
            (written,) = pg.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
            await batcher.check(check_row(tenant, job))
            (flushed,) = pg.execute("SELECT pg_current_wal_flush_lsn() >= %s",
                                    (written,)).fetchone()
            assert flushed
    await batcher.close()


async def test_the_log_rows_are_written_on_one_plan_per_connection(rig, tenant, database_url):
    """The worker's connections force custom plans (for job_finalize_many); the log's
    insert, written with a batch of completions, keeps one generic plan, and the
    connection's mode is back after it."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from postrelay.core.db import sqlalchemy_url
    from postrelay.orchestrator.queries import email_log_upsert_many
    from postrelay.queue.queries import job_complete_many

    engine = create_async_engine(sqlalchemy_url(database_url), connect_args={
        "options": "-c plan_cache_mode=force_custom_plan"})
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        for _ in range(7):  # psycopg prepares a statement on its sixth run
            job = rig.enqueue(tenant)
            await job_complete_many(conn, worker="w", ids=[job], attempts=[1], flush=False,
                                    effects=[email_log_upsert_many([check_row(tenant, job) | {
                                        "from_address": "noreply@acme.example",
                                        "to_addresses": [], "message_id": f"<{job}@acme.example>",
                                        "status": "sent"}])])
            mode = (await conn.execute(text("SHOW plan_cache_mode"))).scalar_one()
            assert mode == "force_custom_plan"
        plans = (await conn.execute(text(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%INSERT INTO mdm.aa_email_log AS l%'"))).all()
        logged = (await conn.execute(text("SELECT count(*) FROM mdm.aa_email_log"))).scalar_one()
    await engine.dispose()
    assert [(g >= 1, c) for g, c in plans] == [(True, 0)]
    assert logged == 7
