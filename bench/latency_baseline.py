"""The pickup-latency baseline: the least a LISTEN-driven consumer can do, in plain psycopg.

    BENCH_LATENCY_FILE=/tmp/lat.txt python -m bench.latency_baseline postgresql://...

One connection in autocommit mode LISTENs on postrelay's channel; on each notification it
claims pending jobs with one statement (the same CTE as the drain baseline) and, for each,
appends `time.time() - payload.t0` to BENCH_LATENCY_FILE, then marks them done. No pool,
no event loop, no ORM: what is left is PostgreSQL's NOTIFY delivery and one claim round
trip, i.e. this machine's floor for postrelay's pickup latency. Stops on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import time

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


def main(url: str) -> None:
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    out = open(os.environ["BENCH_LATENCY_FILE"], "a", encoding="ascii")  # noqa: SIM115
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("LISTEN postrelay_jobs")
        # Nothing is claimed before the first notification: the benchmark enqueues only once
        # it sees this connection's last query is the LISTEN (in pg_stat_activity).
        woken = False
        while not stop:
            while woken and (rows := conn.execute(CLAIM).fetchall()):
                now = time.time()
                for _id, payload in rows:
                    out.write(f"{now - float(payload['t0']):.6f}\n")
                out.flush()
                conn.execute(COMPLETE, ([row[0] for row in rows],))
            # A short timeout so that SIGTERM is noticed; a notification ends the wait at once.
            # The generator must be finished before the next query: it holds the connection.
            woken = bool(list(conn.notifies(timeout=0.2, stop_after=1)))


if __name__ == "__main__":
    main(sys.argv[1])
