"""The completion of a batch of successes is planned once per connection, and its one plan
finds the rows by primary key, also when it was made while the table was empty."""

from __future__ import annotations

import psycopg
from sqlalchemy import text

from postrelay.core.dbcall import psycopg_sql
from postrelay.queue import JobSpec, enqueue_many, queries
from postrelay.queue.queries import JOB_SQL


def _claimed(engine, tenant, n: int) -> list:  # noqa: ANN001
    with engine.begin() as conn:
        ids = enqueue_many(conn, [JobSpec("reindex", {}, tenant) for _ in range(n)])
        conn.execute(text("UPDATE mdm.aa_job SET status = 'running', claimed_by = 'w', "
                          "attempts = 1 WHERE id = ANY(:ids)"), {"ids": ids})
    return ids


async def test_one_plan_per_connection_by_primary_key(engine, tenant, libpq):
    # As the worker's connections: custom plans forced, for job_finalize_many.
    conn = await psycopg.AsyncConnection.connect(
        libpq, autocommit=True, options="-c plan_cache_mode=force_custom_plan")
    async with conn:
        with engine.begin() as c:  # planned while the table is empty and analyzed so
            c.execute(text("ANALYZE mdm.aa_job"))
        for _ in range(7):  # psycopg prepares a statement on its sixth run
            ids = _claimed(engine, tenant, 3)
            assert await queries.job_complete_many(conn, worker="w", ids=ids,
                                                   attempts=[1, 1, 1]) == set(ids)
        cursor = await conn.execute(
            "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%CAST(j.status AS text)%'")
        [(name, generic, custom)] = await cursor.fetchall()
        assert generic >= 1 and custom == 0

        _claimed(engine, tenant, 2000)  # the table is large now, its statistics stale
        async with conn.transaction():
            await conn.execute(psycopg_sql(JOB_SQL["job_complete_plan"]))
            cursor = await conn.execute(
                f"EXPLAIN (FORMAT JSON) EXECUTE {name}('{{}}', '{{}}', 'w')")
            [(plan,)] = await cursor.fetchall()
    # By primary key, the arrays hashed: no scan of the table, no loop over the batch squared.
    assert "aa_job_pkey" in str(plan) and "Hash Join" in str(plan)
    assert "Seq Scan" not in str(plan) and "Nested Loop" not in str(plan)


async def test_only_the_jobs_still_held_at_their_attempt_complete(engine, tenant, libpq):
    ids = _claimed(engine, tenant, 3)
    with engine.begin() as conn:  # rescued and claimed again by another worker meanwhile
        conn.execute(text("UPDATE mdm.aa_job SET claimed_by = 'other' WHERE id = :id"),
                     {"id": ids[0]})
    async with await psycopg.AsyncConnection.connect(libpq, autocommit=True) as conn:
        done = await queries.job_complete_many(conn, worker="w", ids=ids, attempts=[1, 1, 2])
    assert done == {ids[1]}
