"""The history benchmark's steady drain (bench/history_bench.py, `--steady-minutes`): a
producer enqueues `--steady-rate` jobs/s while one worker drains them, autovacuum left to
itself; meanwhile the backlog, the overview's reads and the overview page over HTTP are
sampled; afterwards, what the tables look like. See bench/README.md, "History benchmark".
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import threading
import time
from typing import Any

import httpx
import psycopg
from sqlalchemy import create_engine

from bench.dashboard_bench import _sign_in
from bench.harness import BenchDatabase, WorkerProcess, unfinished_count
from postrelay.core.db import sqlalchemy_url
from postrelay.dashboard import queries
from postrelay.queue import JobSpec, enqueue_many
from tests.api.server import serve_database

SAMPLE_SECS = 5.0
TABLES = ("aa_job", "aa_email_log", "aa_outbox_event", "aa_job_audit")
# The done rollup's mark, and how far behind the database's clock it is: the overview
# counts the minutes after it live (queue/maintenance/rollup.py).
ROLLUP_LAG = ("SELECT CAST(EXTRACT(EPOCH FROM now() - until) AS float8)"
              " FROM mdm.aa_job_done_rollup")
ROLLUP_CAUGHT_UP_SECS = 180.0  # the margin, the open minute and a round or so


def steady(bench: BenchDatabase, args: argparse.Namespace, *, page_target_ms: float) -> None:
    """A producer enqueues `--steady-rate` jobs/s for `--steady-minutes` while one worker
    drains them, autovacuum left to itself; then what the tables look like. The overview
    page's times are printed beside `page_target_ms`."""
    before = _table_stats(bench)
    stop = threading.Event()
    produced = [0]

    def produce() -> None:
        quiet = bench.engine.execution_options(postrelay_notify=False)
        tick, per_tick = 0.1, max(1, round(args.steady_rate * 0.1))
        next_at = time.monotonic()
        while not stop.is_set():
            specs = [JobSpec("reindex", {"n": i}, bench.tenant_id) for i in range(per_tick)]
            with quiet.begin() as conn:
                enqueue_many(conn, specs)
            produced[0] += per_tick
            next_at += tick
            time.sleep(max(0.0, next_at - time.monotonic()))

    seconds = args.steady_minutes * 60
    # The overview's reads as the dashboard's engine runs them (custom plans, no JIT), while
    # the drain leaves dead index entries behind that autovacuum has not removed yet.
    dashboard = create_engine(sqlalchemy_url(bench.url), connect_args={
        "options": "-c plan_cache_mode=force_custom_plan -c jit=off"})
    key = "bench-" + secrets.token_urlsafe(32)
    # The worker leads maintenance, as a deployed one does: the rescuer, and the done rollup
    # that the overview's last hour reads.
    with WorkerProcess(bench, "bench.noop_app", 10, maintenance=True) as worker, \
            bench.connect(autocommit=True) as watch, \
            serve_database(bench.url, key) as url, \
            httpx.Client(base_url=url, timeout=120) as client:
        _sign_in(client, key)
        lag = _rollup_caught_up(watch, worker)
        print(f"steady drain: the done rollup caught up ({lag:.0f} s behind) before the"
              f" producer started", flush=True)
        producer = threading.Thread(target=produce, name="producer")
        producer.start()
        backlog, overview_ms, page_ms, lags = [], [], [], []
        try:
            ends = time.monotonic() + seconds
            while time.monotonic() < ends:
                worker.check_alive()
                backlog.append(unfinished_count(watch))
                lags.append(_rollup_lag(watch))
                began = time.perf_counter()
                with dashboard.begin() as conn:
                    queries.overview(conn, None)
                overview_ms.append((time.perf_counter() - began) * 1000)
                page_ms.append(_get_ms(client, "/dashboard/"))
                time.sleep(SAMPLE_SECS)
        finally:
            stop.set()
            producer.join()
            dashboard.dispose()
    time.sleep(1.5)  # the statistics are flushed at most once a second
    after = _table_stats(bench)
    page_p50, page_max = statistics.median(page_ms), max(page_ms)
    print(f"steady drain: {args.steady_minutes:g} min, {produced[0]:,} jobs enqueued at"
          f" {args.steady_rate:,.0f}/s by one producer, drained by one worker (concurrency 10,"
          f" maintenance on); backlog sampled every {SAMPLE_SECS:g} s: median"
          f" {statistics.median(backlog):,.0f}, max {max(backlog):,}; the overview's reads"
          f" meanwhile: median {statistics.median(overview_ms):.1f} ms, max"
          f" {max(overview_ms):.1f} ms; the done rollup's mark behind the clock: median"
          f" {statistics.median(lags):.0f} s, max {max(lags):.0f} s")
    print(f"overview page during the drain (GET /dashboard/, whole page, {len(page_ms)}"
          f" requests, one per sample): median {page_p50:.1f} ms, max {page_max:.1f} ms;"
          f" target < {page_target_ms:.0f} ms: median"
          f" {'yes' if page_p50 < page_target_ms else 'NO'},"
          f" max {'yes' if page_max < page_target_ms else 'NO'}")
    _print_tables(before, after)
    with bench.connect(autocommit=True) as conn:
        for name, size, scans in conn.execute(
                "SELECT indexrelname, pg_relation_size(indexrelid), idx_scan"
                " FROM pg_stat_user_indexes WHERE relname = 'aa_job' ORDER BY 1").fetchall():
            print(f"    {name:26} {_mb(size):>10}  scans {scans:,}")


def _get_ms(client: httpx.Client, path: str) -> float:
    """One GET, to the response's last byte, in ms."""
    began = time.perf_counter()
    response = client.get(path)
    elapsed = (time.perf_counter() - began) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"{path}: HTTP {response.status_code}")
    return elapsed


def _rollup_lag(watch: psycopg.Connection[Any]) -> float:
    row = watch.execute(ROLLUP_LAG).fetchone()
    return float("inf") if row is None or row[0] is None else float(row[0])


def _rollup_caught_up(watch: psycopg.Connection[Any], worker: WorkerProcess,
                      timeout: float = 300) -> float:
    """Wait until the worker's maintenance has tallied the hour the earlier drains filled
    (a catch-up of a few rounds); returns how far behind the clock the mark is."""
    deadline = time.monotonic() + timeout
    while (lag := _rollup_lag(watch)) > ROLLUP_CAUGHT_UP_SECS:
        worker.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError("the done rollup did not catch up")
        time.sleep(0.5)
    return lag


def _print_tables(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> None:
    header = ("table", "live", "dead", "dead %", "autovacuums", "autoanalyzes",
              "table size", "index size", "grew by")
    lines = [header]
    for name in TABLES:
        b, a = before[name], after[name]
        live, dead = a["live"], a["dead"]
        lines.append((name, f"{live:,}", f"{dead:,}",
                      f"{100 * dead / max(live + dead, 1):.1f}",
                      f"{a['autovacuums'] - b['autovacuums']}",
                      f"{a['autoanalyzes'] - b['autoanalyzes']}",
                      _mb(a["table"]), _mb(a["indexes"]),
                      _mb(a["table"] + a["indexes"] - b["table"] - b["indexes"])))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for n, line in enumerate(lines):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(line, widths, strict=True))))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def _table_stats(bench: BenchDatabase) -> dict[str, dict[str, int]]:
    with bench.connect(autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname, n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count,"
            " pg_table_size(relid), pg_indexes_size(relid) FROM pg_stat_user_tables"
            " WHERE schemaname = 'mdm' AND relname = ANY(%s)", (list(TABLES),)).fetchall()
    return {r[0]: {"live": r[1], "dead": r[2], "autovacuums": r[3], "autoanalyzes": r[4],
                   "table": r[5], "indexes": r[6]} for r in rows}


def _mb(size: int) -> str:
    return f"{size / 1024 / 1024:,.1f} MB"
