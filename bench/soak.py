"""A robustness run, not a benchmark: worker processes drain a queue while they are killed
at random, and the database is checked afterwards for every job's fate.

    .venv/bin/python -m bench.soak                       # 30,000 jobs, 40 s of kills
    .venv/bin/python -m bench.soak --jobs 5000 --seconds 15
    .venv/bin/python -m bench.soak --restart-server \\
        "pg_ctlcluster --skip-systemctl-redirect 15 main restart -m immediate"
    .venv/bin/python -m bench.soak --email --jobs 3000   # outbox -> relay -> SMTP

Three workers (maintenance on, a 2 s lease, retries after 0.2 s) run the jobs of
`bench/soak_app.py`, and their cron schedulers an entry that fires every second. Every
0.3-1.2 s one of them gets SIGKILL (seven times in ten) or SIGTERM and a new one takes its
place; with --restart-server, that command restarts the database server once, halfway. Then
the run waits for the queue to settle and checks that every job ended as its payload says it
must (done, or dlq for the bad input, with its audit row), that none is pending or running,
that no job counted more attempts than it may, and that the cron entry fired every second
(without --restart-server: no slot missed).
It prints the figures and exits 1 if a check failed.

With --email, the jobs are emails: one outbox event each, turned into an `email_send` job by
a relay process (killed now and then too) and sent by the workers into an SMTP sink that
notes every message it accepts. The checks: every event relayed once into one job, every job
done with one `sent` log row, every recipient sent at least one message, and a second copy
only where the log shows the crash window the issue allows (an attempt lost with its worker
logged `unknown`, resent by the default policy), with the same Message-ID.
"""

from __future__ import annotations

import argparse
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.email_bench import APP as EMAIL_APP
from bench.email_bench import CONNECTIONS, TEMPLATES, sink_process
from bench.harness import WORKER_MAIN, BenchDatabase, WorkerProcess, bench_database
from bench.soak_app import SLOW_SECS, permanent
from postrelay.queue import JobSpec, enqueue_many
from postrelay.queue.cron import cron_create, cron_delete
from postrelay.relay import EventSpec, emit_many

CRON_NAME = "soak-every-second"
LEASE_SECS = 2.0
# Up to this long before the sink answers DATA: messages are in flight when a worker dies.
SINK_DELAY_SECS = 0.2
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
    parser.add_argument("--email", action="store_true",
                        help="emails through the outbox, a relay and an SMTP sink")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with bench_database() as bench:
        print(f"server: {bench.server}; {args.jobs:,} {'emails' if args.email else 'jobs'}, "
              f"{args.workers} workers, {args.seconds:.0f} s of kills", flush=True)
        if args.email:
            failures = _email_soak(bench, args)
        else:
            slow = max(1, args.jobs // 50)
            _enqueue(bench, args.jobs, slow)
            with bench.engine.begin() as conn:
                cron_create(conn, CRON_NAME, "* * * * * *", "index_sync", {},
                            tenant_id=bench.tenant_id)
            _run(bench, args, [_worker(bench, "bench.soak_app") for _ in range(args.workers)],
                 before_settling=_stop_cron)
            failures = _check(bench, args.jobs, slow)
            failures += _check_cron(bench, missed_allowed=bool(args.restart_server))
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


def _worker(bench: BenchDatabase, app: str, env: dict[str, str] | None = None
            ) -> WorkerProcess:
    concurrency = random.choice([5, 20, 50])
    process = WorkerProcess(bench, env={**ENV, **(env or {})}, argv=[
        "-c", WORKER_MAIN, "worker", "--app", app, "--concurrency", str(concurrency)])
    return process.__enter__()


def _relay(bench: BenchDatabase, env: dict[str, str]) -> WorkerProcess:
    return WorkerProcess(bench, env={**ENV, **env}, argv=[
        "-c", WORKER_MAIN, "relay", "--app", EMAIL_APP]).__enter__()


def _run(bench: BenchDatabase, args: argparse.Namespace, processes: list[WorkerProcess],
         *, settled: str = "SELECT count(*) FROM mdm.aa_job "
                           "WHERE status IN ('pending', 'running')",
         before_settling: Callable[[BenchDatabase], None] | None = None) -> None:
    """Kill and replace one of `processes` (each restarts the way it was started) at random
    for args.seconds, run `before_settling`, then wait until the `settled` query counts
    nothing left to do."""
    kills = terms = 0
    restart_at = args.seconds / 2 if args.restart_server else None
    started = time.monotonic()
    try:
        while time.monotonic() - started < args.seconds:
            time.sleep(random.uniform(0.3, 1.2))
            elapsed = time.monotonic() - started
            if restart_at is not None and elapsed >= restart_at:
                restart_at = None
                subprocess.run(shlex.split(args.restart_server), check=True)
                print(f"[{elapsed:4.1f} s] database server restarted", flush=True)
            n = random.randrange(len(processes))
            if random.random() < 0.7:
                proc = processes[n].proc
                assert proc is not None
                proc.kill()
                proc.wait()
                processes[n].proc = None
                kills += 1
            else:
                processes[n].stop()
                terms += 1
            processes[n] = WorkerProcess(bench, env=processes[n].env,
                                       argv=processes[n].argv).__enter__()
            print(f"[{elapsed:4.1f} s] {kills} SIGKILL, {terms} SIGTERM; {_counts(bench)}",
                  flush=True)
        if before_settling is not None:
            before_settling(bench)
        # Killed workers' jobs come back after the lease; slow jobs take a while more.
        deadline = time.monotonic() + 10 * LEASE_SECS + 3 * SLOW_SECS + 60
        while time.monotonic() < deadline:
            with bench.connect() as conn:
                ((left,),) = conn.execute(settled).fetchall()
            if not left:
                break
            time.sleep(1.0)
        print(f"settled after {time.monotonic() - started:.0f} s: {_counts(bench)}")
    finally:
        for process in processes:
            process.stop()


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

        counts = dict(rows("SELECT status::text, count(*) FROM mdm.aa_job "
                           "WHERE job_kind <> 'index_sync' GROUP BY 1"))
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


def _stop_cron(bench: BenchDatabase) -> None:
    bench.engine.dispose()  # its pooled connections died if the server was restarted
    with bench.engine.begin() as conn:
        cron_delete(conn, CRON_NAME)


def _check_cron(bench: BenchDatabase, *, missed_allowed: bool) -> list[str]:
    """A slot every second; missed slots only where the server was down (after downtime
    only the latest missed slot fires). A slot cannot fire twice here: its job's
    idempotency key (entry and slot) is unique, so the check is for gaps."""
    with bench.connect() as conn:
        keys = [key for (key,) in conn.execute(
            "SELECT idempotency_key FROM mdm.aa_job WHERE job_kind = 'index_sync'")]
    slots = sorted(datetime.fromisoformat(key.split(":", 2)[2]) for key in keys)
    gaps = [(b - a).total_seconds() for a, b in zip(slots, slots[1:], strict=False)]
    missed = sum(round(gap) - 1 for gap in gaps)
    print(f"cron: {len(slots)} slots fired over {(slots[-1] - slots[0]).total_seconds():.0f} s"
          f", {missed} missed" if slots else "cron: no slot fired")
    if not slots:
        return ["the cron entry never fired"]
    if missed and not missed_allowed:
        return [f"{missed} cron slots missed while workers were running"]
    return []


def _email_soak(bench: BenchDatabase, args: argparse.Namespace) -> list[str]:
    n = args.jobs
    with (tempfile.TemporaryDirectory() as tmp,
          sink_process(Path(tmp) / "received", delay=SINK_DELAY_SECS) as sink):
        env = {"POSTRELAY_SMTP_HOST": "127.0.0.1", "POSTRELAY_SMTP_PORT": str(sink.port),
               "POSTRELAY_SMTP_POOL_SIZE": str(CONNECTIONS),
               "POSTRELAY_EMAIL_TEMPLATES_DIR": str(TEMPLATES),
               "POSTRELAY_EMAIL_FROM": "Soak <soak@postrelay.example>"}
        for start in range(0, n, 1_000):
            with bench.engine.begin() as conn:
                emit_many(conn, [
                    EventSpec("user.signed_up",
                              {"user": {"name": f"User {i}", "email": f"user{i}@example.com"}},
                              bench.tenant_id, "user", i)
                    for i in range(start, min(n, start + 1_000))])
        processes = [_relay(bench, env)]
        processes += [_worker(bench, EMAIL_APP, env) for _ in range(args.workers)]
        _run(bench, args, processes, settled=(
            "SELECT (SELECT count(*) FROM mdm.aa_outbox_event WHERE handled_at IS NULL)"
            " + (SELECT count(*) FROM mdm.aa_job WHERE status IN ('pending', 'running'))"))
        received = Counter()
        ids_by_rcpt: dict[str, set[str]] = {}
        for line in (Path(tmp) / "received").read_text().splitlines():
            message_id, *rcpts = line.split()
            for rcpt in rcpts:
                received[rcpt] += 1
                ids_by_rcpt.setdefault(rcpt, set()).add(message_id)
    return _check_email(bench, n, received, ids_by_rcpt)


def _check_email(bench: BenchDatabase, n: int, received: Counter[str],
                 ids_by_rcpt: dict[str, set[str]]) -> list[str]:
    failures = []
    with bench.connect() as conn:
        def one(sql: str) -> Any:
            return conn.execute(sql).fetchone()[0]  # type: ignore[index]

        unhandled = one("SELECT count(*) FROM mdm.aa_outbox_event WHERE handled_at IS NULL")
        jobs = one("SELECT count(*) FROM mdm.aa_job WHERE job_kind = 'email_send'")
        done = one("SELECT count(*) FROM mdm.aa_job WHERE job_kind = 'email_send' "
                   "AND status = 'done'")
        sent_rows = dict(conn.execute(
            "SELECT recipients[1], count(*) FROM mdm.aa_email_log WHERE status = 'sent' "
            "GROUP BY 1").fetchall())
        unknown = {r for (r,) in conn.execute(
            "SELECT DISTINCT recipients[1] FROM mdm.aa_email_log WHERE status = 'unknown'")}
        statuses = dict(conn.execute(
            "SELECT status::text, count(*) FROM mdm.aa_email_log GROUP BY 1").fetchall())
    if unhandled:
        failures.append(f"{unhandled} events never relayed")
    if jobs != n:
        failures.append(f"{jobs} email jobs for {n} events")
    if done != n:
        failures.append(f"{done} email jobs done of {n}")
    expected = {f"user{i}@example.com" for i in range(n)}
    if set(sent_rows) != expected or any(c != 1 for c in sent_rows.values()):
        failures.append(f"{len(expected - set(sent_rows))} recipients without a sent row, "
                        f"{sum(1 for c in sent_rows.values() if c != 1)} with several")
    missing = expected - set(received)
    if missing:
        failures.append(f"{len(missing)} recipients never got their message")
    twice = {r for r, c in received.items() if c > 1}
    if twice - unknown:
        failures.append(f"{len(twice - unknown)} recipients got a second copy with no "
                        "unknown outcome in the log")
    if any(len(ids_by_rcpt[r]) != 1 for r in twice):
        failures.append("a second copy carried another Message-ID")
    print(f"log rows by status: {statuses}; messages received: {sum(received.values()):,} "
          f"for {len(received):,} recipients; second copies: {len(twice)} (unknown outcomes "
          f"in the log: {len(unknown)})")
    return failures


if __name__ == "__main__":
    main()
