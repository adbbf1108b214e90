"""Pickup latency: from an enqueuer's commit to the handler starting, on an idle worker.

The enqueuer notes `time.time()` just before each job's INSERT and just before its COMMIT;
the consumer writes `seq time.time()` when the job starts. The figure is from the start of
COMMIT (which is when the job and its NOTIFY become visible) to the handler's start; the
same measured from the INSERT is given beside it. The worker is woken by LISTEN/NOTIFY,
not by its poll. The same jobs, enqueued the same way, are then picked up by
bench/latency_baseline.py (one psycopg connection: LISTEN, claim), blocking and on
asyncio: this machine's floors for the figure.
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

REGISTERED = "SELECT count(*) FROM mdm.aa_worker"


@dataclass(frozen=True)
class Latency:
    p50: float  # from the start of COMMIT to the handler's start
    p99: float
    max: float
    from_insert_p50: float  # from just before the INSERT instead


@dataclass(frozen=True)
class Pickups:
    """Per job: seconds from the start of its INSERT, and of its COMMIT, to its pickup."""

    from_insert: list[float]
    from_commit: list[float]


def pickup_latencies(
    bench: BenchDatabase, n: int, rounds: int = 3
) -> tuple[Latency, Latency, Latency]:
    """(postrelay, blocking baseline, asyncio baseline). The consumers take turns in
    `rounds` rounds of n/rounds jobs, so that a change in the machine's load hits all
    alike."""
    per_round = max(1, n // rounds)
    ours: list[Pickups] = []
    floor: list[Pickups] = []
    async_floor: list[Pickups] = []
    baseline = ["-m", "bench.latency_baseline", bench.libpq]
    for _ in range(rounds):
        # postrelay: an idle `postrelay worker --app bench.latency_app --concurrency 10`
        ours.append(_measure(bench, per_round, WorkerProcess(
            bench, "bench.latency_app", 10, env={})))
        # baselines: LISTEN and claim on one plain psycopg connection
        floor.append(_measure(bench, per_round, WorkerProcess(bench, env={}, argv=baseline)))
        async_floor.append(_measure(bench, per_round, WorkerProcess(
            bench, env={}, argv=[*baseline, "--asyncio"])))
    return _summary(ours), _summary(floor), _summary(async_floor)


def polling_pickup_latency(
    bench: BenchDatabase, n: int, env: dict[str, str], rounds: int = 3
) -> Latency:
    """The same figure for a worker that does not LISTEN (through a transaction pooler:
    `env` says how it reaches the database), which finds each job by its poll."""
    per_round = max(1, n // rounds)
    return _summary([
        _measure(bench, per_round, WorkerProcess(bench, "bench.latency_app", 10, env=dict(env)),
                 listening=False)
        for _ in range(rounds)])


def _measure(bench: BenchDatabase, n: int, consumer: WorkerProcess, *,
             listening: bool = True) -> Pickups:
    """The pickup latencies of `n` jobs picked up by `consumer`; once it LISTENs, or (not
    `listening`) once its worker row is there."""
    reset_queue(bench)
    with tempfile.TemporaryDirectory(prefix="postrelay-bench-") as tmp:
        path = Path(tmp) / "latency.txt"
        path.touch()
        consumer.env[LATENCY_FILE_ENV] = str(path)
        consumer.env["PGAPPNAME"] = app_name = f"postrelay-bench-{uuid.uuid4().hex[:8]}"

        def recorded() -> int:
            return path.read_bytes().count(b"\n")

        with consumer as worker, bench.connect(autocommit=True) as watch:
            if listening:
                wait_until(lambda: watch.execute(LISTENING, (app_name,)).fetchone()[0] > 0,  # type: ignore[index]
                           timeout=60, worker=worker, what="the consumer to LISTEN")
            else:
                wait_until(lambda: watch.execute(REGISTERED).fetchone()[0] > 0,  # type: ignore[index]
                           timeout=60, worker=worker, what="the worker to register")
            _send(bench, WARMUP)
            wait_until(lambda: recorded() >= WARMUP, timeout=30, worker=worker,
                       what="the warm-up jobs")
            sent = _send(bench, n, first=WARMUP)
            wait_until(lambda: recorded() >= WARMUP + n, timeout=30, worker=worker,
                       what="every job to be picked up")
        picked = {int(seq): float(at) for seq, at in
                  (line.split() for line in path.read_text().splitlines())}
        return Pickups(
            from_insert=[picked[seq] - inserted for seq, (inserted, _) in sent.items()],
            from_commit=[picked[seq] - committed for seq, (_, committed) in sent.items()],
        )


def _summary(rounds: list[Pickups]) -> Latency:
    values = sorted(v for r in rounds for v in r.from_commit)
    return Latency(
        p50=statistics.median(values),
        p99=_percentile(values, 0.99),
        max=values[-1],
        from_insert_p50=statistics.median(v for r in rounds for v in r.from_insert),
    )


def _send(bench: BenchDatabase, n: int, first: int = 0) -> dict[int, tuple[float, float]]:
    """Enqueue `n` jobs numbered from `first`, one every INTERVAL_SECS on a fixed schedule,
    each in its own transaction; returns for each its (INSERT, COMMIT) start times."""
    sent = {}
    start = time.monotonic()
    for i in range(n):
        pause = start + i * INTERVAL_SECS - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        with bench.engine.connect() as conn:
            txn = conn.begin()
            inserted = time.time()
            enqueue(conn, "reindex", {"seq": first + i}, tenant_id=bench.tenant_id)
            committed = time.time()
            txn.commit()
        sent[first + i] = (inserted, committed)
    return sent


def _percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an ordered list."""
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
    return ordered[rank - 1]
