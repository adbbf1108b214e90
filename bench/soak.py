"""A robustness run, not a benchmark: worker processes drain a queue while they are killed
at random, and the database is checked afterwards for every job's fate.

    .venv/bin/python -m bench.soak                       # 30,000 jobs, 40 s of kills
    .venv/bin/python -m bench.soak --jobs 5000 --seconds 15
    .venv/bin/python -m bench.soak --restart-server \\
        "pg_ctlcluster --skip-systemctl-redirect 15 main restart -m immediate"

Three workers (maintenance on, a 2 s lease, retries after 0.2 s) run the jobs of
`bench/soak_app.py`. Every 0.3-1.2 s one of them gets SIGKILL (seven times in ten) or SIGTERM
and a new one takes its place; with --restart-server, that command restarts the database
server once, halfway. Then the run waits for the queue to settle and checks that every job
ended as its payload says it must (done, or dlq for the bad input, with its audit row), that
none is pending or running, and that no job counted more attempts than it may. It prints the
figures and exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import random
import shlex
import signal
import subprocess
import sys
import time
from typing import Any

from bench.harness import WORKER_MAIN, BenchDatabase, WorkerProcess, bench_database
from bench.soak_app import SLOW_SECS, permanent
from postrelay.queue import JobSpec, enqueue_many

LEASE_SECS = 2.0
ENV = {
    "POSTRELAY_JOB_LEASE_SECS": str(LEASE_SECS),
    "POSTRELAY_JOB_RETRY_DELAY_SECS": "0.2",
    "POSTRELAY_MAINTENANCE_INTERVAL_SECS": "0.5",
    "POSTRELAY_WORKER_GRACE_SECS": "1",
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--seconds", type=float, default=40.0, help="how long to kill workers")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--restart-server", metavar="COMMAND",
                        help="a shell command that restarts the database server, run once")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with bench_database() as bench:
        print(f"server: {bench.server}; {args.jobs:,} jobs, {args.workers} workers, "
              f"{args.seconds:.0f} s of kills", flush=True)
        slow = max(1, args.jobs // 50)
        _enqueue(bench, args.jobs, slow)
        _run(bench, args)
        failures = _check(bench, args.jobs, slow)
    for failure in failures:
        print(f"FAILED: {failure}")
    sys.exit(1 if failures else 0)


def _enqueue(bench: BenchDatabase, fast: int, slow: int) -> None:
    specs = [JobSpec("reindex", {"i": i}, bench.tenant_id) for i in range(fast)]
    specs += [JobSpec("bulk_import", {"i": i}, bench.tenant_id) for i in range(slow)]
    random.shuffle(specs)
    for start in range(0, len(specs), 10_000):
        with bench.engine.begin() as conn:
            enqueue_many(conn, specs[start:start + 10_000])


def _worker(bench: BenchDatabase) -> WorkerProcess:
    concurrency = random.choice([5, 20, 50])
    process = WorkerProcess(bench, env=ENV, argv=[
        "-c", WORKER_MAIN, "worker", "--app", "bench.soak_app",
        "--concurrency", str(concurrency)])
    return process.__enter__()


def _run(bench: BenchDatabase, args: argparse.Namespace) -> None:
    workers = [_worker(bench) for _ in range(args.workers)]
    kills = terms = 0
    restart_at = args.seconds / 2 if args.restart_server else None
    started = time.monotonic()
    try:
        while (elapsed := time.monotonic() - started) < args.seconds:
            time.sleep(random.uniform(0.3, 1.2))
            if restart_at is not None and elapsed >= restart_at:
                restart_at = None
                subprocess.run(shlex.split(args.restart_server), check=True)
                print(f"[{elapsed:4.1f} s] database server restarted", flush=True)
            n = random.randrange(len(workers))
            if random.random() < 0.7:
                proc = workers[n].proc
                assert proc is not None
                proc.kill()
                proc.wait()
                workers[n].proc = None
                kills += 1
            else:
                workers[n].stop()
                terms += 1
            workers[n] = _worker(bench)
            print(f"[{elapsed:4.1f} s] {kills} SIGKILL, {terms} SIGTERM; {_counts(bench)}",
                  flush=True)
        # Killed workers' jobs come back after the lease; slow jobs take a while more.
        deadline = time.monotonic() + 10 * LEASE_SECS + 3 * SLOW_SECS + 60
        while time.monotonic() < deadline:
            counts = _counts(bench)
            if not counts.get("pending") and not counts.get("running"):
                break
            time.sleep(1.0)
        print(f"settled after {time.monotonic() - started:.0f} s: {_counts(bench)}")
    finally:
        for worker in workers:
            worker.stop()


def _counts(bench: BenchDatabase) -> dict[str, int]:
    with bench.connect() as conn:
        rows = conn.execute(
            "SELECT status::text, count(*) FROM mdm.aa_job GROUP BY 1 ORDER BY 1").fetchall()
    return dict(rows)


def _check(bench: BenchDatabase, fast: int, slow: int) -> list[str]:
    failures = []
    with bench.connect() as conn:
        def rows(sql: str) -> list[Any]:
            return conn.execute(sql).fetchall()

        counts = dict(rows("SELECT status::text, count(*) FROM mdm.aa_job GROUP BY 1"))
        if sum(counts.values()) != fast + slow:
            failures.append(f"{sum(counts.values())} jobs in the table, {fast + slow} enqueued")
        dead = {i for (i,) in rows("SELECT (payload->>'i')::int FROM mdm.aa_job "
                                   "WHERE status = 'dlq' AND job_kind = 'reindex'")}
        expected_dead = {i for i in range(fast) if permanent(i)}
        if dead != expected_dead:
            failures.append(f"dead reindex jobs: {len(dead - expected_dead)} unexpected, "
                            f"{len(expected_dead - dead)} missing")
        expected_done = fast + slow - len(expected_dead)
        if counts.get("done", 0) != expected_done:
            failures.append(f"{counts.get('done', 0)} jobs done, {expected_done} expected")
        ((over,),) = rows("SELECT count(*) FROM mdm.aa_job "
                          "WHERE attempts > max_attempts OR attempts < 0")
        ((unaudited,),) = rows(
            "SELECT count(*) FROM mdm.aa_job j WHERE status = 'dlq' AND NOT EXISTS ("
            " SELECT 1 FROM mdm.aa_job_audit a WHERE a.job_id = j.id AND a.action = 'job_dlq')")
        ((open_ended,),) = rows("SELECT count(*) FROM mdm.aa_job "
                                "WHERE status IN ('done', 'dlq') AND completed_at IS NULL")
        for count, what in ((over, "more attempts than max_attempts"),
                            (unaudited, "in the DLQ without a job_dlq audit row"),
                            (open_ended, "finished without completed_at")):
            if count:
                failures.append(f"{count} jobs {what}")
        attempts = rows("SELECT job_kind::text, attempts, count(*) FROM mdm.aa_job "
                        "GROUP BY 1, 2 ORDER BY 1, 2")
    print("attempts per job (kind, attempts, jobs): "
          + ", ".join(f"{k} {a}: {n:,}" for k, a, n in attempts))
    return failures


if __name__ == "__main__":
    main()
