"""Flow control's figures (bench/queue_bench.py, section `flow`): what fair claiming and the
pause check cost a drain when no control is in use, a drain of 1,000 tenants' interleaved
jobs, and how soon tenant B's job is claimed behind tenant A's backlog.

Every drain here is one `postrelay worker --app bench.noop_app` process, measured by the
database as in drain_bench.py. The variants alternate in rounds so that a change in the
machine's load hits each alike; the best round of each is kept.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from bench.harness import (
    BenchDatabase,
    Drained,
    WorkerProcess,
    done_count,
    drained,
    prefill,
    reset_queue,
    wait_until,
)
from postrelay.queue import enqueue, ensure_tenant, limit_remove, limit_set

FAIR = {"POSTRELAY_FAIR_CLAIMING": "true"}
UNFAIR = {"POSTRELAY_FAIR_CLAIMING": "false"}


def drain_variants(bench: BenchDatabase, n: int, concurrency: int, rounds: int,
                   base_tree: Path | None) -> dict[str, Drained]:
    """One tenant's `n` jobs drained by: the code in `base_tree` (another checkout, when
    given), this code with fairness off, and with fairness on; best of `rounds`."""
    variants: dict[str, tuple[dict[str, str], Path | None]] = {
        "unfair": (UNFAIR, None), "fair": (FAIR, None)}
    if base_tree is not None:
        variants = {"base": ({}, base_tree), **variants}
    best: dict[str, Drained] = {}
    for _ in range(rounds):
        for name, (env, tree) in variants.items():
            prefill(bench, n)
            result = _drain(bench, n, concurrency, env, tree)
            if name not in best or result.per_sec > best[name].per_sec:
                best[name] = result
    return best


def limited_drain_variants(bench: BenchDatabase, n: int, concurrency: int, rounds: int,
                           base_tree: Path | None) -> dict[str, Drained]:
    """One tenant's `n` jobs drained with no limit (`plain`) and under a limit that never
    binds (`limited`: a rate far past any drain's), so every claim is a limited one: what
    the limited claim costs beside the plain claim, by this code and by the code in
    `base_tree` (`base limited`), when given; fair claiming on; best of `rounds`."""
    variants: dict[str, tuple[bool, Path | None]] = {"plain": (False, None),
                                                     "limited": (True, None)}
    if base_tree is not None:
        variants["base limited"] = (True, base_tree)
    best: dict[str, Drained] = {}
    for _ in range(rounds):
        for name, (limited, tree) in variants.items():
            prefill(bench, n)
            if limited:
                with bench.engine.begin() as conn:
                    limit_set(conn, actor="bench", kind="reindex", rate="1000000/s",
                              burst=1_000_000)
            try:
                result = _drain(bench, n, concurrency, FAIR, tree)
            finally:
                if limited:
                    with bench.engine.begin() as conn:
                        limit_remove(conn, actor="bench", kind="reindex")
            if name not in best or result.per_sec > best[name].per_sec:
                best[name] = result
    return best


def tenants_drain(bench: BenchDatabase, n: int, tenants: int, concurrency: int,
                  rounds: int) -> dict[str, Drained]:
    """`n` jobs of `tenants` tenants, interleaved (job i is tenant i mod tenants), drained
    with fairness on and off; best of `rounds`."""
    ids = _tenants(bench, tenants)
    best: dict[str, Drained] = {}
    for _ in range(rounds):
        for name, env in (("unfair", UNFAIR), ("fair", FAIR)):
            reset_queue(bench)
            _insert(bench, ids, n)
            result = _drain(bench, n, concurrency, env, None)
            if name not in best or result.per_sec > best[name].per_sec:
                best[name] = result
    return best


@dataclass(frozen=True)
class Pickup:
    p50: float
    p99: float
    max: float
    backlog_before: int
    backlog_after: int


def pickup_behind_backlog(bench: BenchDatabase, backlog: int, samples: int,
                          concurrency: int) -> Pickup:
    """Seconds from the commit of tenant B's job to the claim that takes it, one job every
    20 ms, while a fair worker drains tenant A's `backlog` jobs (enqueued first)."""
    reset_queue(bench)
    a = bench.tenant_id
    with bench.engine.begin() as conn:
        b = ensure_tenant(conn, "bench-b")
    _insert(bench, [a], backlog)
    committed: dict[UUID, float] = {}
    with (WorkerProcess(bench, "bench.noop_app", concurrency, env=FAIR) as worker,
          bench.connect(autocommit=True) as watch):
        # Draining A's backlog (or, without one, idle and listening: the baseline).
        wait_until(lambda: done_count(watch) >= min(backlog, 1000) and _registered(watch),
                   timeout=120, worker=worker, what="the worker to start")
        before = _pending(watch, a)
        for _ in range(samples):
            # With its NOTIFY, as an application enqueues: it wakes an idle worker.
            with bench.engine.begin() as conn:
                job = enqueue(conn, "reindex", {}, tenant_id=b)
            committed[job] = time.time()
            time.sleep(0.02)
        wait_until(lambda: _unclaimed(watch, list(committed)) == 0, timeout=120,
                   worker=worker, what="B's jobs to be claimed")
        after = _pending(watch, a)
        rows = watch.execute(
            "SELECT id, EXTRACT(EPOCH FROM claimed_at)::float8 FROM mdm.aa_job "
            "WHERE id = ANY(%s)", (list(committed),)).fetchall()
    waits = sorted(max(0.0, claimed - committed[job]) for job, claimed in rows)
    q = statistics.quantiles(waits, n=100, method="inclusive")
    return Pickup(q[49], q[98], waits[-1], before, after)


def _drain(bench: BenchDatabase, n: int, concurrency: int, env: dict[str, str],
           tree: Path | None) -> Drained:
    worker = WorkerProcess(bench, "bench.noop_app", concurrency, env=dict(env))
    if tree is not None:
        worker.cwd = tree
    with worker, bench.connect(autocommit=True) as watch:
        wait_until(lambda: done_count(watch) >= n, timeout=60 + n / 100, poll=0.2,
                   worker=worker, what=f"the worker to drain {n} jobs")
    result = drained(bench)
    if result.done != n:
        raise RuntimeError(f"worker drained {result.done} of {n} jobs")
    return result


def _tenants(bench: BenchDatabase, count: int) -> list[UUID]:
    with bench.engine.begin() as conn:
        return [ensure_tenant(conn, f"bench-{i:05}") for i in range(count)]


def _insert(bench: BenchDatabase, tenants: list[UUID], n: int) -> None:
    """`n` due no-op jobs, job i of tenant i mod len(tenants), in due order; then VACUUM
    ANALYZE, as prefill does."""
    with bench.connect(autocommit=True) as conn:
        conn.execute(
            "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, available_at) "
            "SELECT (%s::uuid[])[1 + g %% %s], 'reindex', jsonb_build_object('n', g), "
            "       now() - interval '1 hour' + g * interval '1 microsecond' "
            "FROM generate_series(0, %s - 1) AS g", (tenants, len(tenants), n))
        conn.execute("VACUUM ANALYZE mdm.aa_job")


def _registered(conn) -> bool:  # type: ignore[no-untyped-def]
    return conn.execute("SELECT count(*) FROM mdm.aa_worker").fetchone()[0] > 0


def _pending(conn, tenant: UUID) -> int:  # type: ignore[no-untyped-def]
    return conn.execute("SELECT count(*) FROM mdm.aa_job WHERE tenant_id = %s "
                        "AND status = 'pending'", (tenant,)).fetchone()[0]


def _unclaimed(conn, ids: list[UUID]) -> int:  # type: ignore[no-untyped-def]
    return conn.execute("SELECT count(*) FROM mdm.aa_job WHERE id = ANY(%s) "
                        "AND claimed_at IS NULL", (ids,)).fetchone()[0]


@dataclass(frozen=True)
class Achieved:
    per_sec: float
    busiest_second: int


def rate_achieved(bench: BenchDatabase, rate: int, burst: int, workers: int, secs: float,
                  concurrency: int = 50) -> Achieved:
    """Claims per second under a limit of `rate`/s (burst `burst`) on the drained kind,
    with `workers` worker processes, over `secs` seconds from one second after the first
    claim (the burst and the start-up left out); and the most claims in any one second."""
    prefill(bench, int(rate * (secs + 3) * 1.2))
    with bench.engine.begin() as conn:
        limit_set(conn, actor="bench", kind="reindex", rate=f"{rate}/s", burst=burst)
    try:
        procs = [WorkerProcess(bench, "bench.noop_app", concurrency, env={})
                 for _ in range(workers)]
        with bench.connect(autocommit=True) as watch:
            for proc in procs:
                proc.__enter__()
            try:
                wait_until(lambda: done_count(watch) >= rate * (secs + 2), poll=0.2,
                           timeout=secs * 5 + 60, worker=procs[0], what="the limited drain")
            finally:
                for proc in procs:
                    proc.stop()
            count, busiest = watch.execute(
                "WITH c AS (SELECT claimed_at FROM mdm.aa_job WHERE claimed_at IS NOT NULL), "
                "t AS (SELECT min(claimed_at) + interval '1 second' AS t0 FROM c) "
                "SELECT (SELECT count(*) FROM c, t WHERE claimed_at >= t.t0 "
                "        AND claimed_at < t.t0 + make_interval(secs => %s)), "
                "       (SELECT max(n) FROM (SELECT count(*) AS n FROM c "
                "        GROUP BY date_trunc('second', claimed_at)) s)", (secs,)).fetchone()
    finally:
        with bench.engine.begin() as conn:
            limit_remove(conn, actor="bench", kind="reindex")
    return Achieved(count / secs, busiest)
