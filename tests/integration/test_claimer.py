"""The claim loop's held connection: kept across claims, replaced after a failure."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from postrelay.queue.claimer import ClaimConnection


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
            assert mode == ("auto",)
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
