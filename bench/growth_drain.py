"""Drains on a table that keeps its history: the first on an empty `aa_job`, then more of the
same size beside the `done` rows the earlier ones left (nothing is truncated in between).

    .venv/bin/python -m bench.growth_drain [--jobs 20000] [--drains 4] [--concurrency 10]

Each drain: N pending no-op jobs enqueued with enqueue_many, VACUUM ANALYZE, then one
`postrelay worker --app bench.noop_app` at the given concurrency empties the queue. The rate
is the database's: N / (last completed_at - first claimed_at) over that drain's jobs, so the
clock starts once the worker has claimed. The index sizes after each drain are printed, and
the scans and tuples each index saw during the drain.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psutil
import psycopg

from bench.cpu import process_cpu
from bench.harness import (
    BenchDatabase,
    WorkerProcess,
    bench_database,
    fill,
    unfinished_count,
    wait_until,
)
from bench.history_load import load_done_jobs


def enqueue_pending(bench: BenchDatabase, n: int, *, batch: int = 10_000) -> datetime:
    """`n` pending `reindex` jobs beside whatever the table holds, then VACUUM ANALYZE;
    returns the database time just before the first was written."""
    with bench.connect(autocommit=True) as conn:
        since = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
    fill(bench, n, batch=batch)
    return since


def drain_rate(bench: BenchDatabase, since: datetime) -> tuple[int, float]:
    """(jobs done, jobs/s) over the jobs created since `since`."""
    with bench.connect() as conn:
        done, span = conn.execute(
            "SELECT count(*), EXTRACT(EPOCH FROM max(completed_at) - min(claimed_at))::float8"
            " FROM mdm.aa_job WHERE status = 'done' AND created_at >= %s", (since,)
        ).fetchone()  # type: ignore[misc]
    return done, done / span if span else float("nan")


@dataclass(frozen=True)
class DrainFigures:
    per_sec: float  # jobs/s by the database's clock
    server_us: float  # CPU µs per job in the worker's backends
    worker_us: float  # CPU µs per job in the worker process


def drain_new(bench: BenchDatabase, n: int, concurrency: int,
              env: dict[str, str] | None = None) -> DrainFigures:
    """Enqueue `n` jobs beside the table's history and drain them with one worker. CPU is
    counted from the worker's first claim (its start-up is not), in the worker process and
    in the server backends of this database: on a shared machine, CPU per job varies far
    less than the rate."""
    since = enqueue_pending(bench, n)
    with (
        WorkerProcess(bench, "bench.noop_app", concurrency, env=env or {}) as worker,
        bench.connect(autocommit=True) as watch,
    ):
        def left() -> int:
            return unfinished_count(watch)

        wait_until(lambda: left() < n, timeout=60, poll=0.005, worker=worker,
                   what="the worker's first claim")
        assert worker.proc is not None
        meter = BackendMeter(watch, worker.proc.pid)
        wait_until(lambda: left() == 0, timeout=60 + n / 100, poll=0.2, worker=worker,
                   what=f"the worker to drain {n} jobs")
        server, own = meter.spent()
    done, per_sec = drain_rate(bench, since)
    if done != n:
        raise RuntimeError(f"worker drained {done} of {n} jobs")
    return DrainFigures(per_sec, server / n * 1e6, own / n * 1e6)


class BackendMeter:
    """CPU seconds of one client process and of the server backends serving this database
    (other connections, such as `watch` itself, excluded), from construction on."""

    def __init__(self, watch: psycopg.Connection[Any], client_pid: int) -> None:
        self._watch = watch
        self._client = psutil.Process(client_pid)
        self._client_before = process_cpu(self._client)
        self._before = {p.pid: process_cpu(p) for p in self._backends()}

    def _backends(self) -> list[psutil.Process]:
        pids = [row[0] for row in self._watch.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchall()]
        found = []
        for pid in pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                found.append(psutil.Process(pid))
        return found

    def spent(self) -> tuple[float, float]:
        server = sum(max(0.0, process_cpu(p) - self._before.get(p.pid, 0.0))
                     for p in self._backends())
        return server, process_cpu(self._client) - self._client_before



def index_stats(bench: BenchDatabase) -> dict[str, tuple[int, int, int]]:
    """name -> (size in bytes, index scans, tuples read) for aa_job's indexes."""
    with bench.connect(autocommit=True) as conn:
        rows: list[Any] = conn.execute(
            "SELECT indexrelname, pg_relation_size(indexrelid), idx_scan, idx_tup_read"
            " FROM pg_stat_user_indexes WHERE relname = 'aa_job' ORDER BY indexrelname"
        ).fetchall()
    return {name: (size, scans, read) for name, size, scans, read in rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.growth_drain", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--drains", type=int, default=4, help="drains on the same table")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--history", type=int, default=0,
                        help="done jobs to COPY in before the first drain (default none)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with bench_database() as bench:
        print(f"server: {bench.server}; {args.jobs:,} jobs per drain, "
              f"concurrency {args.concurrency}")
        if args.history:
            started = time.monotonic()
            with bench.connect() as conn:
                load_done_jobs(conn, bench.tenant_id, args.history)
            with bench.connect(autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE mdm.aa_job")
            print(f"loaded {args.history:,} done jobs in {time.monotonic() - started:.0f} s")
        first = None
        for n in range(args.drains):
            before = index_stats(bench)
            figures = drain_new(bench, args.jobs, args.concurrency)
            per_sec = figures.per_sec
            after = index_stats(bench)
            first = first or per_sec
            beside = args.history + n * args.jobs
            print(f"drain {n + 1} ({beside:,} done rows beside): {per_sec:,.0f} jobs/s"
                  f" ({per_sec / first:.2f}x the first); CPU per job: server"
                  f" {figures.server_us:.0f} µs,"
                  f" worker {figures.worker_us:.0f} µs")
            for name, (size, scans, read) in after.items():
                s0, r0 = before.get(name, (0, 0, 0))[1:]
                print(f"    {name:26} {size / 1024:8,.0f} kB  scans {scans - s0:7,}"
                      f"  tuples read {read - r0:10,}")


if __name__ == "__main__":
    main()
