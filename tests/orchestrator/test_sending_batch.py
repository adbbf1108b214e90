"""The sending marks of concurrent attempts are committed together, and one refused row
fails only its own attempt."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import psycopg
from sqlalchemy import text

from postrelay.orchestrator.sending import SendingBatcher


def sending_row(tenant: uuid.UUID, job_id: uuid.UUID | str) -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "tenant_id": str(tenant), "job_id": str(job_id),
            "event_id": None, "template": "welcome", "template_version": "v1",
            "category": None, "from_address": "noreply@acme.example",
            "recipients": [f"{job_id}@example.com"], "to_addresses": [f"{job_id}@example.com"],
            "cc_addresses": [], "bcc_addresses": [], "subject": "Hi",
            "message_id": f"<{job_id}@acme.example>", "attempt": 1}


def statuses(engine) -> list[str]:  # noqa: ANN001
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT status FROM mdm.aa_email_log")).scalars())


def marks(engine) -> int:  # noqa: ANN001
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM mdm.aa_email_sending")).scalar_one()


async def test_concurrent_attempts_share_one_round_trip(rig, tenant, async_engine, engine):
    jobs = [rig.enqueue(tenant) for _ in range(20)]
    batcher = SendingBatcher(async_engine)
    starts = await asyncio.gather(*(batcher.begin(sending_row(tenant, j), resend_unknown=True)
                                    for j in jobs))
    assert all(s.sending and not s.earlier and s.unknown_now == 0 for s in starts)
    assert marks(engine) == 20 and statuses(engine) == []  # the log row comes with the outcome
    assert batcher.round_trips <= 2  # one by one would be 20

    # A second attempt of each finds the first one's mark: its outcome is unknown.
    again = await asyncio.gather(*(batcher.begin(sending_row(tenant, j), resend_unknown=False)
                                   for j in jobs))
    assert all(s.unknown_now == 1 and not s.sending for s in again)
    assert statuses(engine) == ["unknown"] * 20 and marks(engine) == 0
    await batcher.close()


async def test_a_refused_row_fails_only_its_own_attempt(rig, tenant, async_engine, engine):
    jobs = [rig.enqueue(tenant) for _ in range(5)]
    batcher = SendingBatcher(async_engine)
    rows = [sending_row(tenant, j) for j in jobs]
    bad = sending_row(tenant, uuid.uuid4())
    bad["attempt"] = "first"  # not an integer: the database refuses the row
    rows.insert(2, bad)
    results = await asyncio.gather(*(batcher.begin(r, resend_unknown=True) for r in rows),
                                   return_exceptions=True)
    assert isinstance(results[2], psycopg.errors.InvalidTextRepresentation)
    assert [r.sending for i, r in enumerate(results) if i != 2] == [True] * 5
    assert marks(engine) == 5
    await batcher.close()


async def test_a_cancelled_attempt_does_not_stop_the_others(rig, tenant, async_engine, engine):
    jobs = [rig.enqueue(tenant) for _ in range(3)]
    batcher = SendingBatcher(async_engine)
    tasks = [asyncio.create_task(batcher.begin(sending_row(tenant, j), resend_unknown=True))
             for j in jobs]
    await asyncio.sleep(0)  # every attempt is waiting for the write
    tasks[0].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[0], asyncio.CancelledError)
    assert done[1].sending and done[2].sending
    # The cancelled attempt's mark was written all the same: its next attempt finds it, as
    # it would after a timeout between this step and the SMTP server.
    assert marks(engine) == 3
    await batcher.close()


async def test_the_batch_statement_is_planned_once(rig, tenant, async_engine):
    """The worker's pooled connections force custom plans (for job_finalize_many); the
    batcher's own connection keeps one generic plan instead of planning every write."""
    batcher = SendingBatcher(async_engine)
    for _ in range(8):  # psycopg prepares a statement on its sixth run
        await batcher.begin(sending_row(tenant, rig.enqueue(tenant)), resend_unknown=True)
    async with batcher._held.use() as conn:
        cursor = await conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%aa_email_sending%'")
        assert await cursor.fetchall() == [(3, 0)]
    await batcher.close()


def test_the_work_per_batch_does_not_grow_with_the_log(tenant, engine, libpq):
    """Each sent message leaves a log row and a deleted mark (dead until VACUUM) behind.
    Earlier attempts are looked up by job, so the statement touches the same few pages
    however long the log and however many marks came and went."""
    from postrelay.core.dbcall import psycopg_sql
    from postrelay.orchestrator.queries import EMAIL_SQL
    from postrelay.queue import JobSpec, enqueue_many

    with engine.begin() as conn:
        old = enqueue_many(conn, [JobSpec("email_send", {}, tenant) for _ in range(3000)])
        fresh = enqueue_many(conn, [JobSpec("email_send", {}, tenant) for _ in range(5)])
    with psycopg.connect(libpq, autocommit=True) as pg:
        for table in ("aa_email_log", "aa_email_sending"):
            pg.execute(f"ALTER TABLE mdm.{table} SET (autovacuum_enabled = off)")
        pg.execute(psycopg_sql(EMAIL_SQL["email_send_begin_many"]),
                   {"rows": json.dumps([sending_row(tenant, j) | {"resend_unknown": True}
                                        for j in old])})
        pg.execute("""
            WITH sent AS (DELETE FROM mdm.aa_email_sending RETURNING *)
            INSERT INTO mdm.aa_email_log SELECT (jsonb_populate_record(NULL::mdm.aa_email_log,
                sent.row || '{"status": "sent"}' || jsonb_build_object('created_at', now()))).*
            FROM sent""")
        rows = [sending_row(tenant, j) | {"resend_unknown": True} for j in fresh]
        with pg.transaction(force_rollback=True):
            ((plan,),) = pg.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                                    + psycopg_sql(EMAIL_SQL["email_send_begin_many"]),
                                    {"rows": json.dumps(rows)}).fetchall()
        for table in ("aa_email_log", "aa_email_sending"):
            pg.execute(f"ALTER TABLE mdm.{table} RESET (autovacuum_enabled)")
    top = plan[0]["Plan"]
    pages = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
    assert pages < 100, f"{pages} pages for a batch of 5 beside 3,000 sent messages"
