"""Pickup latency: from an enqueuer's commit to the handler starting, on an idle worker.

The enqueuer takes `t0 = time.time()` just before its INSERT, so each figure also holds
the INSERT's round trip; that part is measured separately (`before_commit`) so the reader
can take it off. The worker is woken by LISTEN/NOTIFY, not by its poll. The same jobs,
enqueued the same way, are then picked up by bench/latency_baseline.py (one psycopg
connection: LISTEN, claim), which is this machine's floor for the figure.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.harness import BenchDatabase, WorkerProcess, reset_queue, wait_until
from postrelay.queue import enqueue

# Read by bench/latency_app.py in the worker (not imported here: it registers a handler).
LATENCY_FILE_ENV = "BENCH_LATENCY_FILE"
WARMUP = 10
INTERVAL_SECS = 0.02
# Which consumer is listening: each gets its own application_name through PGAPPNAME, so a
# previous consumer's connection, still closing, is not mistaken for the new one's.
LISTENING = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND application_name = %s"
    " AND query = 'LISTEN postrelay_jobs'"
)


@dataclass(frozen=True)
class Latency:
    p50: float
    p99: float
    max: float
    before_commit_p50: float  # of the figures above, the part spent before COMMIT


def pickup_latencies(bench: BenchDatabase, n: int, rounds: int = 3) -> tuple[Latency, Latency]:
    """(postrelay, baseline). The consumers take turns in `rounds` rounds of n/rounds jobs,
    so that a change in the machine's load hits both alike."""
    per_round = max(1, n // rounds)
    ours: list[tuple[list[float], list[float]]] = []
    floor: list[tuple[list[float], list[float]]] = []
    for _ in range(rounds):
        # postrelay: an idle `postrelay worker --app bench.latency_app --concurrency 10`
        ours.append(_measure(bench, per_round, WorkerProcess(
            bench, "bench.latency_app", 10, env={})))
        # baseline: LISTEN and claim on one plain psycopg connection
        floor.append(_measure(bench, per_round, WorkerProcess(
            bench, env={}, argv=["-m", "bench.latency_baseline", bench.libpq])))
    return _summary(ours), _summary(floor)


def _measure(
    bench: BenchDatabase, n: int, consumer: WorkerProcess
) -> tuple[list[float], list[float]]:
    """(pickup latencies, before-commit times) of `n` jobs picked up by `consumer`."""
    reset_queue(bench)
    with tempfile.TemporaryDirectory(prefix="postrelay-bench-") as tmp:
        path = Path(tmp) / "latency.txt"
        path.touch()
        consumer.env[LATENCY_FILE_ENV] = str(path)
        consumer.env["PGAPPNAME"] = app_name = f"postrelay-bench-{uuid.uuid4().hex[:8]}"

        def recorded() -> int:
            return path.read_bytes().count(b"\n")

        with consumer as worker, bench.connect(autocommit=True) as watch:
            wait_until(lambda: watch.execute(LISTENING, (app_name,)).fetchone()[0] > 0,  # type: ignore[index]
                       timeout=60, worker=worker, what="the consumer to LISTEN")
            _send(bench, WARMUP)
            wait_until(lambda: recorded() >= WARMUP, timeout=30, worker=worker,
                       what="the warm-up jobs")
            before_commit = _send(bench, n)
            wait_until(lambda: recorded() >= WARMUP + n, timeout=30, worker=worker,
                       what="every job to be picked up")
        return [float(x) for x in path.read_text().split()[WARMUP:]], before_commit


def _summary(rounds: list[tuple[list[float], list[float]]]) -> Latency:
    values = sorted(v for latencies, _ in rounds for v in latencies)
    before_commit = [v for _, times in rounds for v in times]
    return Latency(
        p50=statistics.median(values),
        p99=_percentile(values, 0.99),
        max=values[-1],
        before_commit_p50=statistics.median(before_commit),
    )


def _send(bench: BenchDatabase, n: int) -> list[float]:
    """Enqueue `n` jobs, one every INTERVAL_SECS on a fixed schedule, each in its own
    transaction; returns for each the seconds between t0 and the start of its COMMIT."""
    before_commit = []
    start = time.monotonic()
    for i in range(n):
        pause = start + i * INTERVAL_SECS - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        with bench.engine.connect() as conn:
            txn = conn.begin()
            t0 = time.time()
            enqueue(conn, "reindex", {"t0": t0}, tenant_id=bench.tenant_id)
            before_commit.append(time.time() - t0)
            txn.commit()
    return before_commit


def _percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an ordered list."""
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
    return ordered[rank - 1]
