"""Enqueue throughput: one job per transaction, and batches with enqueue_many.

Each postrelay figure stands beside plain psycopg doing the same write on one connection,
so the ratio is what postrelay's API (validation, SQLAlchemy, the tenant and kind checks,
NOTIFY) costs over the bare INSERT.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from psycopg.types.json import Jsonb

from bench.harness import BenchDatabase, reset_queue
from postrelay.queue import JobSpec, enqueue, enqueue_many

BASELINE_INSERT = (
    "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload) VALUES (%s, 'reindex', %s)"
)
BASELINE_INSERT_MANY = (
    "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload)"
    " SELECT r.tenant_id, CAST(r.kind AS mdm.job_kind), CAST(r.payload AS jsonb)"
    " FROM unnest(CAST(%s AS uuid[]), CAST(%s AS text[]), CAST(%s AS text[]))"
    " AS r(tenant_id, kind, payload)"
)
WARMUP = 50  # let the connections open and psycopg prepare its statements first


def payload(i: int) -> dict[str, object]:
    return {"document": i, "index": "products", "reason": "bench"}


def _timed(n: int, one: Callable[[int], None]) -> float:
    for i in range(WARMUP):
        one(-1 - i)
    started = time.perf_counter()
    for i in range(n):
        one(i)
    return n / (time.perf_counter() - started)


def enqueue_one_per_txn(bench: BenchDatabase, n: int) -> dict[str, float]:
    """jobs/s for `enqueue` in its own `engine.begin()` block, with NOTIFY on and off; for
    psycopg INSERT + commit per job; and for that INSERT in an `engine.begin()` block. The
    variants alternate in short rounds so that a change in the machine's load hits them
    alike."""
    tenant = bench.tenant_id
    engine = bench.engine
    quiet = engine.execution_options(postrelay_notify=False)
    results: dict[str, list[float]] = {"postrelay": [], "postrelay_no_notify": [],
                                       "baseline": [], "sqlalchemy": [], "psycopg": []}
    reset_queue(bench)

    def with_notify(i: int) -> None:
        with engine.begin() as conn:
            enqueue(conn, "reindex", payload(i), tenant_id=tenant)

    def without_notify(i: int) -> None:
        with quiet.begin() as conn:
            enqueue(conn, "reindex", payload(i), tenant_id=tenant)

    rounds = 4
    with bench.connect() as pg:
        def plain(i: int) -> None:
            pg.execute(BASELINE_INSERT, (tenant, Jsonb(payload(i))))
            pg.commit()

        def on_psycopg(i: int) -> None:
            # enqueue on the same kind of connection as the baseline: a plain psycopg one.
            enqueue(pg, "reindex", payload(i), tenant_id=tenant)
            pg.commit()

        def sqlalchemy_insert(i: int) -> None:
            # The same plain INSERT through the caller's SQLAlchemy transaction: what is left
            # between this and `enqueue` is postrelay's own cost.
            with quiet.begin() as conn:
                conn.exec_driver_sql(BASELINE_INSERT, (tenant, Jsonb(payload(i))))

        for _ in range(rounds):
            results["baseline"].append(_timed(n // rounds, plain))
            results["sqlalchemy"].append(_timed(n // rounds, sqlalchemy_insert))
            results["postrelay"].append(_timed(n // rounds, with_notify))
            results["postrelay_no_notify"].append(_timed(n // rounds, without_notify))
            results["psycopg"].append(_timed(n // rounds, on_psycopg))
    # The harmonic mean of equal-sized rounds is total jobs / total time.
    return {k: len(v) / sum(1 / r for r in v) for k, v in results.items()}


def enqueue_batches(bench: BenchDatabase, batch: int, total: int) -> dict[str, float]:
    """jobs/s for enqueue_many of `batch` JobSpecs per transaction, and for one psycopg
    INSERT ... SELECT FROM unnest(...) of the same rows. The JobSpecs and payload dicts are
    built before the clock starts (the caller has them); serialising them is timed."""
    tenant = bench.tenant_id
    batches = max(1, total // batch)
    specs = [JobSpec("reindex", payload(i), tenant) for i in range(batch)]
    payloads = [payload(i) for i in range(batch)]
    reset_queue(bench)
    ours = theirs = 0.0
    with bench.connect() as pg:
        for round_no in range(batches + 1):  # round 0 is a warm-up
            started = time.perf_counter()
            with bench.engine.begin() as conn:
                enqueue_many(conn, specs)
            elapsed_ours = time.perf_counter() - started

            started = time.perf_counter()
            pg.execute(BASELINE_INSERT_MANY, (
                [tenant] * batch, ["reindex"] * batch,
                [json.dumps(p, separators=(",", ":")) for p in payloads],
            ))
            pg.commit()
            elapsed_theirs = time.perf_counter() - started
            if round_no > 0:
                ours += elapsed_ours
                theirs += elapsed_theirs
    reset_queue(bench)
    return {"postrelay": batches * batch / ours, "baseline": batches * batch / theirs}
