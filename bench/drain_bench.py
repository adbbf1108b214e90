"""Drain throughput: how fast one worker process empties a queue of no-op jobs, beside a
hand-written psycopg loop doing the same claims and completions with nothing in between.

Throughput is read from the database, N / (last completed_at - first claimed_at), so the
worker's start-up (imports, connecting) does not count, and ours and the baselines are
measured by the same clock.
"""

from __future__ import annotations

from pathlib import Path

from bench.harness import (
    BenchDatabase,
    Drained,
    WorkerProcess,
    done_count,
    drained,
    prefill,
    wait_until,
)

# The claim postrelay makes (queue/sql/claim.sql: job_claim) without the tenant/kind filters
# and the wide RETURNING; the MATERIALIZED fence keeps LIMIT the number of rows locked.
BASELINE_CLAIM = """
WITH c AS MATERIALIZED (
    SELECT id FROM mdm.aa_job
    WHERE status = 'pending' AND available_at <= now()
    ORDER BY priority, available_at
    LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE mdm.aa_job j
SET status = 'running', claimed_by = 'b', claimed_at = now(), attempts = j.attempts + 1
FROM c WHERE j.id = c.id
RETURNING j.id
"""
BASELINE_COMPLETE = (
    "UPDATE mdm.aa_job SET status = 'done', completed_at = now() WHERE id = ANY(%s)"
)


def baseline_drain(bench: BenchDatabase, n: int, batch: int) -> Drained:
    """jobs/s for a psycopg loop on one connection: claim `batch` in one transaction, then
    complete them in another, until the queue is empty."""
    prefill(bench, n)
    with bench.connect() as conn:
        while True:
            ids = [row[0] for row in conn.execute(BASELINE_CLAIM, (batch,)).fetchall()]
            conn.commit()
            if not ids:
                break
            conn.execute(BASELINE_COMPLETE, (ids,))
            conn.commit()
    result = drained(bench)
    if result.done != n:
        raise RuntimeError(f"baseline drained {result.done} of {n} jobs")
    return result


def worker_drain(
    bench: BenchDatabase, n: int, concurrency: int, *, profile_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> Drained:
    """jobs/s for one `postrelay worker --app bench.noop_app --concurrency C` process, with
    `env` added to its environment (e.g. to run it through PgBouncer)."""
    prefill(bench, n)
    profile_out = None
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
        profile_out = profile_dir / f"worker-c{concurrency}.prof"
    with (
        WorkerProcess(bench, "bench.noop_app", concurrency, env=dict(env or {}),
                      profile_out=profile_out) as worker,
        bench.connect(autocommit=True) as watch,
    ):
        wait_until(lambda: done_count(watch) >= n, timeout=60 + n / 100, poll=0.2,
                   worker=worker, what=f"the worker to drain {n} jobs")
    result = drained(bench)
    if result.done != n:
        raise RuntimeError(f"worker drained {result.done} of {n} jobs")
    return result
