"""The pickup-latency baselines: the least a LISTEN-driven consumer can do, in plain psycopg.

    BENCH_LATENCY_FILE=/tmp/lat.txt python -m bench.latency_baseline [--asyncio] postgresql://...

One connection in autocommit mode LISTENs on postrelay's channel; on each notification it
claims pending jobs with one statement (the same CTE as the drain baseline), appends
`seq time.time()` for each to BENCH_LATENCY_FILE (as bench/latency_app.py does), then marks
them done. No pool, no ORM: what is left is PostgreSQL's NOTIFY delivery and one claim
round trip, i.e. this machine's floor for postrelay's pickup latency. With `--asyncio` the
same runs on psycopg's AsyncConnection in an event loop, as postrelay's worker does: the
floor for any asyncio consumer. Stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import IO

import psycopg

CLAIM = """
WITH c AS MATERIALIZED (
    SELECT id FROM mdm.aa_job
    WHERE status = 'pending' AND available_at <= now()
    ORDER BY priority, available_at
    LIMIT 10
    FOR UPDATE SKIP LOCKED
)
UPDATE mdm.aa_job j
SET status = 'running', claimed_by = 'baseline', claimed_at = now(), attempts = j.attempts + 1
FROM c WHERE j.id = c.id
RETURNING j.id, j.payload
"""
COMPLETE = "UPDATE mdm.aa_job SET status = 'done', completed_at = now() WHERE id = ANY(%s)"
# A short timeout so that SIGTERM is noticed; a notification ends the wait at once.
WAIT_SECS = 0.2


def _record(out: IO[str], rows: list[tuple[object, dict[str, object]]]) -> None:
    now = time.time()
    for _id, payload in rows:
        out.write(f"{payload['seq']} {now:.6f}\n")
    out.flush()


def run_sync(url: str, out: IO[str], stopped: list[bool]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("LISTEN postrelay_jobs")
        # Nothing is claimed before the first notification: the benchmark enqueues only once
        # it sees this connection's last query is the LISTEN (in pg_stat_activity).
        woken = False
        while not stopped:
            while woken and (rows := conn.execute(CLAIM).fetchall()):
                _record(out, rows)
                conn.execute(COMPLETE, ([row[0] for row in rows],))
            # The generator must be finished before the next query: it holds the connection.
            woken = bool(list(conn.notifies(timeout=WAIT_SECS, stop_after=1)))


async def run_async(url: str, out: IO[str], stopped: list[bool]) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("LISTEN postrelay_jobs")
        woken = False
        while not stopped:
            while woken and (rows := await (await conn.execute(CLAIM)).fetchall()):
                _record(out, rows)
                await conn.execute(COMPLETE, ([row[0] for row in rows],))
            woken = False
            async for _ in conn.notifies(timeout=WAIT_SECS, stop_after=1):
                woken = True


def main(argv: list[str]) -> None:
    use_asyncio = "--asyncio" in argv
    [url] = [a for a in argv if a != "--asyncio"]
    stopped: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    with open(os.environ["BENCH_LATENCY_FILE"], "a", encoding="ascii") as out:
        if use_asyncio:
            asyncio.run(run_async(url, out, stopped))
        else:
            run_sync(url, out, stopped)


if __name__ == "__main__":
    main(sys.argv[1:])
