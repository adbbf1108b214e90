"""The claim loop's held connection: kept across claims, replaced after a failure, and
set up so that a claim stays cheap."""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from postrelay.core.dbcall import psycopg_sql
from postrelay.queue import queries
from postrelay.queue.claimer import ClaimConnection
from postrelay.queue.queries import JOB_SQL
from tests.factories import insert_job


@pytest.fixture
async def forcing_engine(database_url):
    # As the worker's engine: custom plans forced for job_finalize_many.
    engine = create_async_engine(
        database_url, connect_args={"options": "-c plan_cache_mode=force_custom_plan"})
    yield engine
    await engine.dispose()


async def backend_pid(conn: psycopg.AsyncConnection) -> int:
    return (await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0]


async def test_claims_share_one_connection_and_a_failure_replaces_it(forcing_engine):
    claimer = ClaimConnection(forcing_engine)
    try:
        async with claimer.use() as conn:
            first = await backend_pid(conn)
        async with claimer.use() as conn:
            assert await backend_pid(conn) == first
        with pytest.raises(psycopg.errors.UndefinedTable):
            async with claimer.use() as conn:
                await conn.execute("SELECT * FROM no_such_table")
        async with claimer.use() as conn:
            assert await backend_pid(conn) != first
    finally:
        await claimer.close()


async def test_the_claim_connection_autocommits_plans_generically_and_skips_the_flush(
    forcing_engine,
):
    claimer = ClaimConnection(forcing_engine)
    try:
        async with claimer.use() as conn:
            assert conn.autocommit
            mode = await (await conn.execute("SHOW plan_cache_mode")).fetchone()
            assert mode == ("force_generic_plan",)
            sync = await (await conn.execute("SHOW synchronous_commit")).fetchone()
            assert sync == ("off",)
    finally:
        await claimer.close()
    # The connection was not handed back to the pool with its own settings.
    async with forcing_engine.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        assert await (await raw.execute("SHOW plan_cache_mode")).fetchone() == (
            "force_custom_plan",)
        assert await (await raw.execute("SHOW synchronous_commit")).fetchone() == ("on",)


async def test_a_burst_behind_stale_statistics_is_claimed_by_walking_the_index(
    forcing_engine, engine, tenant,
):
    # The planner last saw an empty table; then a burst arrives before autovacuum looks.
    with engine.begin() as conn:
        conn.execute(text("ANALYZE mdm.aa_job"))
        conn.execute(text(
            "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload) "
            "SELECT :t, 'email_send', '{}' FROM generate_series(1, 5000)"), {"t": tenant})
    claimer = ClaimConnection(forcing_engine)
    try:
        async with claimer.use() as conn:
            await conn.execute("BEGIN")
            cursor = await conn.execute("EXPLAIN (ANALYZE) " + psycopg_sql(JOB_SQL["job_claim"]), {
                "worker": "w", "demand": 3, "tenant_ids": None, "kinds": ["email_send"],
                "fair": True})
            plan = "\n".join(row[0] for row in await cursor.fetchall())
            await conn.execute("ROLLBACK")
    finally:
        await claimer.close()
    # An ordered walk that stops after three rows, not a sort of all 5,000.
    assert "Index Scan using ix_job_dispatch" in plan, plan
    # The only sort is the fair check's, of the few claimed rows, for the most urgent one.
    sorts = re.findall(r"Sort Key: (.*)", plan)
    assert all(key.startswith("candidate.") for key in sorts) and "Bitmap" not in plan, plan


# The types of job_claim's parameters, for a PREPARE that plans it as the worker does.
CLAIM_PARAM_TYPES = {"tenant_ids": "uuid[]", "kinds": "mdm.job_kind[]", "demand": "integer",
                     "worker": "text", "start": "uuid", "weight_tenants": "uuid[]",
                     "weights": "integer[]", "fair": "boolean"}


def numbered(sql: str) -> tuple[str, list[str]]:
    """psycopg's `%(name)s` placeholders as `$1, $2, ...`, with the names in that order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, sql), names


@pytest.mark.parametrize("statement", ["job_claim", "job_claim_fair"])
async def test_the_claim_plan_walks_keys_even_when_planned_generically(
    forcing_engine, engine, tenant, statement,
):
    # The planner last saw a backlog of thousands, since drained. A generic plan reckons
    # LIMIT as a tenth of those: a claim that joined the rows it claimed to the table then
    # hashed every row of it.
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload) "
            "SELECT :t, 'reindex', '{}' FROM generate_series(1, 3000)"), {"t": tenant})
        conn.execute(text("ANALYZE mdm.aa_job"))
        conn.execute(text("UPDATE mdm.aa_job SET status = 'done', completed_at = now()"))
        conn.execute(text(
            "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload) "
            "SELECT :t, 'reindex', '{}' FROM generate_series(1, 5)"), {"t": tenant})
    sql, names = numbered(psycopg_sql(JOB_SQL[statement]))
    types = ", ".join(CLAIM_PARAM_TYPES[name] for name in names)
    args = {"tenant_ids": "NULL", "kinds": "'{reindex}'", "demand": "3", "worker": "'w'",
            "start": f"'{uuid.uuid4()}'", "weight_tenants": "'{}'", "weights": "'{}'",
            "fair": "true"}
    claimer = ClaimConnection(forcing_engine)
    try:
        async with claimer.use() as conn:
            await conn.execute("BEGIN")
            await conn.execute(f"PREPARE claim_plan ({types}) AS {sql}")
            cursor = await conn.execute(
                "EXPLAIN (ANALYZE) EXECUTE claim_plan "
                f"({', '.join(args[name] for name in names)})")
            plan = "\n".join(row[0] for row in await cursor.fetchall())
            await conn.execute("ROLLBACK")
            await conn.execute("DEALLOCATE claim_plan")
    finally:
        await claimer.close()
    assert "Index Scan using aa_job_pkey" in plan, plan
    # Only the pauses' few rows are read whole (once per claim when none is set).
    assert "Hash" not in plan and not re.search(r"Seq Scan on aa_job\b(?!_pause)", plan), plan
    assert "JIT" not in plan, plan


async def test_claimed_jobs_come_in_priority_order(async_engine, engine, tenant):
    with engine.begin() as conn:  # ids are random: key order is not priority order
        for priority in (5, 1, 9, 3, 7, 2, 8, 4, 6, 0):
            insert_job(conn, tenant_id=tenant, priority=priority)
    async with async_engine.connect() as conn:
        jobs = await queries.job_claim(
            await conn.execution_options(isolation_level="AUTOCOMMIT"),
            worker="w", demand=10, tenant_ids=None, kinds=None)
    assert [job.priority for job in jobs] == list(range(10))
