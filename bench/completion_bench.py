"""Print what writing an email's outcome costs: its log row and its job's completion, as the
worker's completer writes them, beside the same statements as an explicit transaction.

    .venv/bin/python -m bench.completion_bench [--outcomes 3000] [--rounds 5] [--batch 8]...

Each round writes `--outcomes` outcomes of `running` email jobs in batches of `--batch`
(repeatable; default 1, 8 and 20), once each way, alternating:
- *one round trip*: the completer's write — the settings, the log rows' statement
  (`email_log_upsert_many`) and `job_complete_many` in one pipeline, synced once, which the
  server runs as one implicit transaction (queue/completer.py);
- *baseline*: the same statements one round trip each, between BEGIN and COMMIT.
Printed per outcome, the median of the rounds: the CPU time of the server's backend (psutil)
and of this process (the writing client). Nothing else runs in the rounds, so the figures
are steadier than email_bench's; run it on a server of its own all the same.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import psutil
import psycopg

from bench.harness import bench_database
from postrelay.core.dbcall import psycopg_sql
from postrelay.orchestrator.queries import email_log_upsert_many
from postrelay.queue.queries import JOB_SQL, job_complete_many

WORKER = "bench-completer"
Write = Callable[[psycopg.AsyncConnection[Any], list[UUID], list[dict[str, Any]]],
                 Awaitable[None]]


def log_row(job_id: UUID, tenant_id: UUID) -> dict[str, Any]:
    """An email_bench message's log row, as the handler records it."""
    return {"id": str(uuid.uuid4()), "tenant_id": str(tenant_id), "job_id": str(job_id),
            "event_id": str(uuid.uuid4()), "template": "welcome", "template_version": "3f2a9c1e",
            "category": None, "from_address": "Bench <bench@postrelay.example>",
            "recipients": ["user1@example.com"], "to_addresses": ["User 1 <user1@example.com>"],
            "cc_addresses": [], "bcc_addresses": [], "subject": "Welcome, User 1!",
            "message_id": f"<{job_id}@postrelay.example>", "attempt": 1, "status": "sent",
            "queue_id": "4F2A1B3C9D0E",
            "recipient_results": {"user1@example.com": {"status": "accepted"}},
            "error": None, "smtp_code": 250, "smtp_enhanced": "2.0.0",
            "smtp_response": "Ok: queued as 4F2A1B3C9D0E"}


async def one_round_trip(conn: psycopg.AsyncConnection[Any], ids: list[UUID],
                         rows: list[dict[str, Any]]) -> None:
    written = await job_complete_many(conn, worker=WORKER, ids=ids, attempts=[1] * len(ids),
                                      flush=False, effects=[email_log_upsert_many(rows)])
    assert len(written) == len(ids)


async def explicit_transaction(conn: psycopg.AsyncConnection[Any], ids: list[UUID],
                               rows: list[dict[str, Any]]) -> None:
    statement, params = email_log_upsert_many(rows)
    async with conn.transaction():
        await conn.execute(psycopg_sql(JOB_SQL["job_complete_plan_no_flush"]))
        await conn.execute(psycopg_sql(statement), params)
        cursor = await conn.execute(psycopg_sql(JOB_SQL["job_complete_many"], True),
                                    {"worker": WORKER, "ids": ids, "attempts": [1] * len(ids)})
        assert len(await cursor.fetchall()) == len(ids)


WAYS: dict[str, Write] = {"one round trip": one_round_trip,
                          "baseline: explicit transaction": explicit_transaction}


async def measure(outcomes: int, rounds: int, batches: list[int]) -> None:
    with bench_database() as bench:
        total = outcomes * rounds * len(WAYS) * len(batches)
        with bench.connect(autocommit=True) as conn:
            conn.execute(
                "INSERT INTO mdm.aa_job (tenant_id, job_kind, status, payload, claimed_by, "
                "claimed_at, attempts) SELECT %s, 'email_send', 'running', '{}', %s, now(), 1 "
                "FROM generate_series(1, %s)", (bench.tenant_id, WORKER, total))
            conn.execute("VACUUM ANALYZE mdm.aa_job")
            ids = [row[0] for row in conn.execute("SELECT id FROM mdm.aa_job ORDER BY id")]
        conn = await psycopg.AsyncConnection.connect(bench.libpq, autocommit=True)
        cursor = await conn.execute("SELECT pg_backend_pid()")
        backend = psutil.Process((await cursor.fetchone())[0])  # type: ignore[index]
        print(f"server: {bench.server}; {outcomes:,} outcomes per round, {rounds} rounds, "
              "median of the rounds, µs per outcome", flush=True)
        print(f"{'batch':>5}  {'way':32} {'server':>7} {'client':>7}")
        for batch in batches:
            spent: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
            for _ in range(rounds):
                for way, write in WAYS.items():
                    part, ids = ids[:outcomes], ids[outcomes:]
                    chunks = [(part[i:i + batch], [log_row(j, bench.tenant_id)
                                                   for j in part[i:i + batch]])
                              for i in range(0, outcomes, batch)]
                    server, client = _cpu(backend), time.process_time()
                    for chunk, rows in chunks:
                        await write(conn, chunk, rows)
                    spent[way].append(((_cpu(backend) - server) / outcomes * 1e6,
                                       (time.process_time() - client) / outcomes * 1e6))
            for way, figures in spent.items():
                print(f"{batch:>5}  {way:32} {statistics.median(s for s, _ in figures):>7.0f} "
                      f"{statistics.median(c for _, c in figures):>7.0f}")
        await conn.close()


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.completion_bench")
    parser.add_argument("--outcomes", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, action="append", default=None)
    args = parser.parse_args()
    asyncio.run(measure(args.outcomes, args.rounds, args.batch or [1, 8, 20]))


if __name__ == "__main__":
    main()
