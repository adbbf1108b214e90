"""Print what one claim costs while a burst of jobs sits behind stale planner statistics.

    .venv/bin/python -m bench.burst_bench [--jobs 8000] [--demand 3]

The table is analyzed while empty, then `--jobs` pending jobs arrive at once, as when a
relay turns a campaign's events into email jobs faster than autovacuum looks at the table.
The whole backlog is then claimed `--demand` jobs at a time (each batch marked done from
another connection, as a worker's completer does), once on a plain psycopg connection
with the server's planner settings, and once on a worker's claim connection
(`postrelay.queue.claimer.ClaimConnection`). Both run postrelay's own claim statement.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import psycopg
from sqlalchemy.ext.asyncio import create_async_engine

from bench.harness import BenchDatabase, Row, bench_database, print_table, ratio, reset_queue
from postrelay.core.dbcall import psycopg_sql
from postrelay.queue.claimer import ClaimConnection
from postrelay.queue.queries import JOB_SQL

BURST = (
    "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload) "
    "SELECT %s, 'email_send', '{}' FROM generate_series(1, %s)"
)


def burst(bench: BenchDatabase, n: int) -> None:
    reset_queue(bench)
    with bench.connect(autocommit=True) as conn:
        conn.execute("ANALYZE mdm.aa_job")  # empty: the statistics the burst will outrun
        conn.execute(BURST, (bench.tenant_id, n))


async def claim_all(claimer: psycopg.AsyncConnection[Any], bench: BenchDatabase,
                    demand: int) -> list[float]:
    """Claim until nothing is left; returns each claim's seconds."""
    sql = psycopg_sql(JOB_SQL["job_claim"])
    params = {"worker": "bench", "demand": demand, "tenant_ids": None, "kinds": ["email_send"],
              "fair": False}
    times = []
    async with await psycopg.AsyncConnection.connect(bench.libpq, autocommit=True) as done:
        while True:
            started = time.perf_counter()
            rows = await (await claimer.execute(sql, params)).fetchall()
            times.append(time.perf_counter() - started)
            if not rows:
                return times
            await done.execute("UPDATE mdm.aa_job SET status = 'done' WHERE id = ANY(%s)",
                               ([row[0] for row in rows],))


async def plain(bench: BenchDatabase, n: int, demand: int) -> list[float]:
    burst(bench, n)
    async with await psycopg.AsyncConnection.connect(bench.libpq, autocommit=True) as conn:
        return await claim_all(conn, bench, demand)


async def ours(bench: BenchDatabase, n: int, demand: int) -> list[float]:
    burst(bench, n)
    engine = create_async_engine(bench.url)
    claimer = ClaimConnection(engine)
    try:
        async with claimer.use() as conn:
            return await claim_all(conn, bench, demand)
    finally:
        await claimer.close()
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.burst_bench")
    parser.add_argument("--jobs", type=int, default=8_000)
    parser.add_argument("--demand", type=int, default=3)
    args = parser.parse_args()
    with bench_database() as bench:
        print(f"server: {bench.server}; a burst of {args.jobs:,} jobs claimed "
              f"{args.demand} at a time", flush=True)
        theirs = asyncio.run(plain(bench, args.jobs, args.demand))
        mine = asyncio.run(ours(bench, args.jobs, args.demand))
    print()
    rows = []
    for name, pick in (("p50", statistics.median), ("total", sum)):
        a, b = pick(mine), pick(theirs)
        unit = 1e3 if name == "p50" else 1.0
        label = "ms" if name == "p50" else "s"
        rows.append(Row(f"claim {name}, burst behind stale statistics",
                        f"{a * unit:.2f} {label}", f"{b * unit:.2f} {label}", ratio(b, a)))
    print_table(rows)
    print("baseline: the same claim statement on a connection with the server's planner "
          "settings; ratio: how many times faster postrelay's claim connection is")


if __name__ == "__main__":
    main()
