"""What history costs: the queue's, the relay's and the dashboard's figures on empty tables,
then the same in the same run beside 10 million `done` jobs and 10 million email log rows.

    POSTRELAY_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/test \\
        .venv/bin/python -m bench.history_bench                     # 10 M + 10 M rows
    .venv/bin/python -m bench.history_bench --rows 1000000          # a quicker run
    .venv/bin/python -m bench.history_bench --steady-minutes 10     # then a steady drain

The history is streamed in with COPY (bench/history_load.py) and is not timed; VACUUM
ANALYZE follows, as autovacuum leaves a table in steady state. Each figure is measured the
same way on both sides: the drain (one worker at the default concurrency, N no-op jobs,
clocked by the database from the first claim), the pickup latency of an idle worker, the
relay's throughput, and the dashboard's overview and email-log pages over HTTP (time to the
response's first byte, and to its last). Drains and relay runs are repeated and the best
kept on each side, so that a busy moment on a shared machine flatters neither. The steady
drain then runs a producer and one worker side by side for the given minutes, autovacuum
left to itself, and reports dead tuples, autovacuum runs and table and index sizes.
See bench/README.md, "History benchmark".
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import signal
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import create_async_engine

from bench.dashboard_bench import _sign_in
from bench.growth_drain import drain_new
from bench.harness import (
    BenchDatabase,
    Row,
    WorkerProcess,
    bench_database,
    print_table,
    reset_queue,
)
from bench.history_load import load_done_jobs, load_email_log
from bench.history_steady import steady
from bench.latency_bench import LATENCY_FILE_ENV, LISTENING, WARMUP, _percentile, _send
from bench.relay_bench import UNHANDLED, open_pool, routes
from postrelay.queue import queue_status
from postrelay.relay import EventSpec, Relay, RelayConfig, emit_many
from tests.api.server import serve_database

THROUGHPUT_TARGET = 0.9  # x the empty-table figure
PAGE_TARGET_MS = 300.0
# The target is the overview's and the email log's; the other pages are printed beside them.
PAGES = (("overview", "/dashboard/"), ("email log", "/dashboard/emails"))
OTHER_PAGES = (("jobs, done", "/dashboard/jobs?status=done"),
               ("jobs, done, one kind", "/dashboard/jobs?status=done&kind=reindex"),
               ("jobs, pending", "/dashboard/jobs?status=pending"),
               ("dead-letter queue", "/dashboard/dlq"),
               ("outbox", "/dashboard/outbox"),
               ("email log, bounced", "/dashboard/emails?status=bounced"),
               ("cron", "/dashboard/cron"))


@dataclass
class Side:
    """One side's figures: empty tables or beside the history."""

    drain: float = 0.0  # jobs/s, best of the repeats
    drain_cpu: tuple[float, float] = (0.0, 0.0)  # server, worker CPU µs per job (that run)
    pickup_p50: float = 0.0  # ms
    pickup_p99: float = 0.0
    relay: float = 0.0  # events/s, best of the repeats
    pages: dict[str, tuple[float, float]] | None = None  # name -> (first byte, whole) p50 ms
    status_ms: float = 0.0  # queue_status (`postrelay status`, /metrics), p50


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    with bench_database() as bench:
        print(f"server: {bench.server}; history {args.rows:,} done jobs + {args.rows:,} email"
              f" log rows; drains of {args.jobs:,}, relay runs of {args.events:,} events")
        empty = measure(bench, args, "empty tables", empty=True)
        _clear(bench)
        load_started = time.monotonic()
        with bench.connect() as conn:
            load_done_jobs(conn, bench.tenant_id, args.rows)
            _progress(f"loaded {args.rows:,} done jobs")
            load_email_log(conn, bench.tenant_id, args.rows)
        with bench.connect(autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE mdm.aa_job")
            conn.execute("VACUUM ANALYZE mdm.aa_email_log")
            # The load dirtied gigabytes: without a checkpoint now, the checkpointer writes
            # them out during the drains that follow, and every commit's WAL flush waits
            # behind those writes (the first full-size run measured that, not the history).
            conn.execute("CHECKPOINT")
        _progress(f"history loaded and vacuumed in {time.monotonic() - load_started:.0f} s;"
                  f" {_sizes(bench)}")
        full = measure(bench, args, f"beside {args.rows:,} rows")
        print()
        _print(empty, full, args)
        if args.steady_minutes:
            print()
            steady(bench, args, page_target_ms=PAGE_TARGET_MS)
    print(f"\n{time.monotonic() - started:.0f} s")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.history_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000,
                        help="done jobs, and email log rows, to load (default 10,000,000)")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--repeats", type=int, default=3, help="drains and relay runs per side")
    parser.add_argument("--events", type=int, default=20_000, help="events per relay run")
    parser.add_argument("--pickups", type=int, default=200, help="pickup latency samples")
    parser.add_argument("--page-rounds", type=int, default=20, help="requests per page")
    parser.add_argument("--steady-minutes", type=float, default=0.0,
                        help="after the figures, a steady drain of this many minutes")
    parser.add_argument("--steady-rate", type=float, default=2000.0,
                        help="jobs/s the steady drain's producer enqueues (default 2000)")
    return parser.parse_args(argv)


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def measure(bench: BenchDatabase, args: argparse.Namespace, label: str,
            *, empty: bool = False) -> Side:
    side = Side()
    for _ in range(args.repeats):
        if empty:
            reset_queue(bench)
        figures = drain_new(bench, args.jobs, 10)
        if figures.per_sec > side.drain:
            side.drain, side.drain_cpu = figures.per_sec, (figures.server_us, figures.worker_us)
    _progress(f"{label}: drain {side.drain:,.0f} jobs/s")
    side.pickup_p50, side.pickup_p99 = pickups(bench, args.pickups)
    _progress(f"{label}: pickup p50 {side.pickup_p50:.2f} ms, p99 {side.pickup_p99:.2f} ms")
    side.relay = max(asyncio.run(relay_rate(bench, args.events)) for _ in range(args.repeats))
    _progress(f"{label}: relay {side.relay:,.0f} events/s")
    side.pages = pages(bench, args.page_rounds)
    _progress(f"{label}: pages {side.pages}")
    side.status_ms = status_time(bench)
    _progress(f"{label}: queue_status {side.status_ms:.1f} ms")
    return side


def status_time(bench: BenchDatabase, rounds: int = 5) -> float:
    """p50 ms of queue_status, the exact counts behind `postrelay status` and /metrics."""
    samples = []
    for _ in range(rounds):
        began = time.perf_counter()
        with bench.engine.connect() as conn:
            queue_status(conn)
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples)


def _clear(bench: BenchDatabase) -> None:
    """Empty the tables the empty-table side filled, before the history goes in."""
    with bench.connect(autocommit=True) as conn:
        conn.execute("TRUNCATE mdm.aa_job, mdm.aa_job_audit, mdm.aa_outbox_event,"
                     " mdm.aa_outbox_delivery, mdm.aa_email_log, mdm.aa_worker CASCADE")


def pickups(bench: BenchDatabase, n: int) -> tuple[float, float]:
    """(p50, p99) ms from an enqueuer's COMMIT to an idle worker's handler starting, one
    job every 20 ms (bench/latency_bench.py, without emptying the queue first)."""
    with tempfile.TemporaryDirectory(prefix="postrelay-bench-") as tmp:
        path = Path(tmp) / "latency.txt"
        path.touch()
        app_name = f"postrelay-bench-{uuid.uuid4().hex[:8]}"
        consumer = WorkerProcess(bench, "bench.latency_app", 10,
                                 env={LATENCY_FILE_ENV: str(path), "PGAPPNAME": app_name})

        def recorded() -> int:
            return path.read_bytes().count(b"\n")

        with consumer as worker, bench.connect(autocommit=True) as watch:
            _wait(lambda: watch.execute(LISTENING, (app_name,)).fetchone()[0] > 0,  # type: ignore[index]
                  worker, "the worker to LISTEN")
            _send(bench, WARMUP, first=10**9)
            _wait(lambda: recorded() >= WARMUP, worker, "the warm-up jobs")
            sent = _send(bench, n)
            _wait(lambda: recorded() >= WARMUP + n, worker, "every job to be picked up")
        picked = {int(seq): float(at) for seq, at in
                  (line.split() for line in path.read_text().splitlines())}
    values = sorted((picked[seq] - committed) * 1000 for seq, (_, committed) in sent.items())
    return statistics.median(values), _percentile(values, 0.99)


def _wait(predicate: Any, worker: WorkerProcess, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        worker.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


async def relay_rate(bench: BenchDatabase, n: int, batch: int = 500,
                     concurrency: int = 3) -> float:
    """The relay's events/s for `n` waiting events (bench/relay_bench.py, without emptying
    the tables first); the jobs it makes are deleted afterwards, unrun."""
    quiet = bench.engine.execution_options(postrelay_notify=False)
    for start in range(0, n, 10_000):
        specs = [EventSpec("order.placed", {"n": i}, bench.tenant_id, "order", i)
                 for i in range(start, min(n, start + 10_000))]
        with quiet.begin() as conn:
            emit_many(conn, specs)
    with bench.connect(autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE mdm.aa_outbox_event")
    engine = create_async_engine(bench.url, pool_size=concurrency + 1)
    await open_pool(engine, concurrency)
    relay = Relay(engine, routes(),
                  RelayConfig(batch_size=batch, listen=False, concurrency=concurrency))
    with bench.connect(autocommit=True) as watch:
        began = time.perf_counter()
        await relay.start()
        while await asyncio.to_thread(lambda: watch.execute(UNHANDLED).fetchone()[0]):  # type: ignore[index]
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - began
    await relay.stop()
    await engine.dispose()
    with bench.connect(autocommit=True) as conn:
        conn.execute("DELETE FROM mdm.aa_job WHERE status = 'pending'")
        conn.execute("VACUUM ANALYZE mdm.aa_job")
    return n / elapsed


def pages(bench: BenchDatabase, rounds: int) -> dict[str, tuple[float, float]]:
    """Per page: (first byte, whole page) p50 ms over HTTP, signed in with the service
    key, after two warm-up requests."""
    key = "bench-" + secrets.token_urlsafe(32)  # a service key has at least 32 characters
    found: dict[str, tuple[float, float]] = {}
    with serve_database(bench.url, key) as url, httpx.Client(base_url=url,
                                                             timeout=120) as client:
        _sign_in(client, key)
        for name, path in PAGES + OTHER_PAGES:
            first_byte, whole = [], []
            for n in range(rounds + 2 if (name, path) in PAGES else max(rounds // 4, 3) + 2):
                began = time.perf_counter()
                with client.stream("GET", path) as response:
                    chunks = response.iter_raw()
                    next(chunks, b"")
                    got_first = time.perf_counter()
                    for _ in chunks:
                        pass
                    if response.status_code != 200:
                        raise RuntimeError(f"{path}: HTTP {response.status_code}")
                if n >= 2:
                    first_byte.append((got_first - began) * 1000)
                    whole.append((time.perf_counter() - began) * 1000)
            found[name] = (statistics.median(first_byte), statistics.median(whole))
    return found


def _print(empty: Side, full: Side, args: argparse.Namespace) -> None:
    def ratio_row(metric: str, a: float, b: float, unit: str) -> Row:
        r = b / a if a else float("nan")
        return Row(metric, f"{b:,.0f}{unit}", f"{a:,.0f}{unit}", f"{r:.2f}x",
                   f">= {THROUGHPUT_TARGET}x", "yes" if r >= THROUGHPUT_TARGET else "NO")

    rows = [
        ratio_row("drain, 1 worker, concurrency 10", empty.drain, full.drain, "/s"),
        Row("  CPU per job: server, worker", f"{full.drain_cpu[0]:.0f}, {full.drain_cpu[1]:.0f} µs",
            f"{empty.drain_cpu[0]:.0f}, {empty.drain_cpu[1]:.0f} µs"),
        Row("pickup latency p50", f"{full.pickup_p50:.2f} ms", f"{empty.pickup_p50:.2f} ms",
            f"{full.pickup_p50 / empty.pickup_p50:.2f}x"),
        Row("pickup latency p99", f"{full.pickup_p99:.2f} ms", f"{empty.pickup_p99:.2f} ms",
            f"{full.pickup_p99 / empty.pickup_p99:.2f}x"),
        ratio_row("relay, 3 x 500-event batches", empty.relay, full.relay, "/s"),
    ]
    assert empty.pages is not None and full.pages is not None
    for name, _ in PAGES:
        for i, what in enumerate(("first byte", "whole page")):
            value = full.pages[name][i]
            rows.append(Row(f"dashboard {name}, {what} p50", f"{value:.1f} ms",
                            f"{empty.pages[name][i]:.1f} ms", "-",
                            f"< {PAGE_TARGET_MS:.0f} ms",
                            "yes" if value < PAGE_TARGET_MS else "NO"))
    for name, _ in OTHER_PAGES:
        rows.append(Row(f"dashboard {name}, whole page p50", f"{full.pages[name][1]:.1f} ms",
                        f"{empty.pages[name][1]:.1f} ms"))
    rows.append(Row("queue_status (postrelay status, /metrics) p50",
                    f"{full.status_ms:.1f} ms", f"{empty.status_ms:.1f} ms"))
    print(f"postrelay = beside {args.rows:,} done jobs and {args.rows:,} email log rows;"
          f" baseline = the same on empty tables")
    print_table(rows)


def _sizes(bench: BenchDatabase) -> str:
    with bench.connect(autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname, pg_size_pretty(pg_table_size(relid)),"
            " pg_size_pretty(pg_indexes_size(relid)) FROM pg_stat_user_tables"
            " WHERE relname IN ('aa_job', 'aa_email_log') ORDER BY relname").fetchall()
    return "; ".join(f"{name}: table {table}, indexes {indexes}" for name, table, indexes in rows)


if __name__ == "__main__":
    main()
