"""The worker against a real PostgreSQL: outcomes, retries, DLQ, timeouts, shutdown."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from sqlalchemy import text

from postrelay.queue import PermanentError, Registry, RetryAfter, StopJob, enqueue
from postrelay.queue.backoff import FixedBackoff
from postrelay.queue.metrics import WorkerMetrics
from postrelay.queue.model import Job
from postrelay.queue.worker import Worker, WorkerConfig
from tests.factories import audit_rows, job_row


def make_worker(async_engine, libpq, registry, **config) -> Worker:
    config.setdefault("poll_interval_secs", 0.2)
    config.setdefault("grace_secs", 1.0)
    backoff = config.pop("backoff", FixedBackoff(0.05))
    metrics = config.pop("metrics", None)
    return Worker(async_engine, WorkerConfig(**config), registry=registry, backoff=backoff,
                  listen_url=libpq, metrics=metrics)


async def wait_until(predicate, timeout: float = 15.0, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval)


async def run_until(async_engine, libpq, registry, predicate, **config) -> Worker:
    """Start a worker, wait until `predicate()` (a plain function) holds, stop it."""
    worker = make_worker(async_engine, libpq, registry, **config)
    await worker.start()
    try:
        await wait_until(lambda: _async(predicate()))
    finally:
        await worker.stop()
    return worker


def status_of(engine, job_id) -> str:
    with engine.connect() as conn:
        return job_row(conn, job_id)["state"]


async def test_success_marks_done(engine, async_engine, libpq, tenant):
    registry = Registry()
    seen: list[Job] = []

    @registry.handler("reindex")
    async def reindex(job: Job) -> None:
        seen.append(job)

    payload = {"n": 1, "nested": {"list": [1.5, None, True], "text": "tab\t, ünïcode"}}
    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", payload, tenant_id=tenant)
    worker = make_worker(async_engine, libpq, registry)
    await worker.start()
    try:
        await wait_until(lambda: _async(status_of(engine, job_id) == "done"))
    finally:
        await worker.stop()
    with engine.connect() as conn:
        row = job_row(conn, job_id)
    assert row["attempts"] == 1 and row["completed_at"] is not None
    assert row["claimed_by"] == worker.id and worker.id.count("/") == 2
    assert [j.payload for j in seen] == [payload] and seen[0].attempts == 1


async def _async(value):
    return value


async def test_failures_retry_with_backoff_then_dlq_with_audit(engine, async_engine, libpq, tenant):
    registry = Registry()
    runs: list[int] = []

    @registry.handler("reindex")
    async def boom(job: Job) -> None:
        runs.append(job.attempts)
        raise ValueError(f"broken on attempt {job.attempts}")

    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {}, tenant_id=tenant, max_attempts=3)
    worker = make_worker(async_engine, libpq, registry)
    await worker.start()
    try:
        await wait_until(lambda: _async(status_of(engine, job_id) == "dlq"))
    finally:
        await worker.stop()
    with engine.connect() as conn:
        row = job_row(conn, job_id)
        audit = audit_rows(conn, job_id)
    assert runs == [1, 2, 3]
    assert row["attempts"] == 3 and row["completed_at"] is not None
    assert "ValueError: broken on attempt 3" in row["last_error"]
    assert "Traceback" in row["last_error"]
    assert [a["action"] for a in audit] == ["job_dlq"]
    assert audit[0]["detail"]["attempts"] == 3


async def test_error_sets_pending_with_backoff_delay(engine, async_engine, libpq, tenant):
    registry = Registry()

    @registry.handler("reindex")
    async def boom(job: Job) -> None:
        raise RuntimeError("x" * 10_000)

    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {}, tenant_id=tenant)
    worker = make_worker(async_engine, libpq, registry, backoff=FixedBackoff(60))
    await worker.start()
    try:
        await wait_until(lambda: _async(job_row_attempts(engine, job_id) == (1, "pending")))
    finally:
        await worker.stop()
    with engine.connect() as conn:
        row = job_row(conn, job_id)
        now = conn.execute(text("SELECT now()")).scalar_one()
    assert 50 < (row["available_at"] - now).total_seconds() <= 60
    assert len(row["last_error"].encode()) <= 4096


def job_row_attempts(engine, job_id):
    with engine.connect() as conn:
        row = job_row(conn, job_id)
    return row["attempts"], row["state"]


async def test_handler_outcomes_retry_after_permanent_stop(engine, async_engine, libpq, tenant):
    registry = Registry()

    @registry.handler("reindex")
    async def decide(job: Job) -> None:
        match job.payload["do"]:
            case "retry_after":
                if job.attempts == 1:
                    raise RetryAfter(0.1, "not yet")
            case "permanent":
                raise PermanentError("bad input forever")
            case "stop":
                raise StopJob("look at this")

    with engine.begin() as conn:
        retry = enqueue(conn, "reindex", {"do": "retry_after"}, tenant_id=tenant)
        permanent = enqueue(conn, "reindex", {"do": "permanent"}, tenant_id=tenant)
        stop = enqueue(conn, "reindex", {"do": "stop"}, tenant_id=tenant)
    worker = make_worker(async_engine, libpq, registry)
    await worker.start()
    try:
        await wait_until(lambda: _async(
            [status_of(engine, j) for j in (retry, permanent, stop)] == ["done", "dlq", "failed"]
        ))
    finally:
        await worker.stop()
    assert job_row_attempts(engine, retry) == (2, "done")
    assert job_row_attempts(engine, permanent) == (1, "dlq")  # no retries burnt
    with engine.connect() as conn:
        stopped = job_row(conn, stop)
        assert audit_rows(conn, stop) == []
    assert stopped["attempts"] == 1 and "look at this" in stopped["last_error"]


async def test_timeout_counts_as_failure(engine, async_engine, libpq, tenant):
    registry = Registry()

    @registry.handler("reindex", timeout=0.1)
    async def slow(job: Job) -> None:
        await asyncio.sleep(10)

    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {}, tenant_id=tenant, max_attempts=1)
    worker = make_worker(async_engine, libpq, registry)
    await worker.start()
    try:
        await wait_until(lambda: _async(status_of(engine, job_id) == "dlq"))
    finally:
        await worker.stop()
    with engine.connect() as conn:
        assert "exceeded its timeout of 0.1 s" in job_row(conn, job_id)["last_error"]


async def test_concurrent_workers_run_each_job_exactly_once(engine, async_engine, libpq, tenant):
    registry = Registry()
    runs: Counter = Counter()
    active: set = set()
    overlaps: list = []

    @registry.handler("reindex")
    async def track(job: Job) -> None:
        if job.id in active:
            overlaps.append(job.id)
        active.add(job.id)
        runs[job.id] += 1
        await asyncio.sleep(0.001)
        active.discard(job.id)

    from postrelay.queue import JobSpec, enqueue_many

    with engine.begin() as conn:
        ids = enqueue_many(conn, [JobSpec("reindex", {"i": i}, tenant) for i in range(2000)])
    workers = [make_worker(async_engine, libpq, registry, concurrency=25) for _ in range(4)]
    for w in workers:
        await w.start()
    try:
        await wait_until(lambda: _async(count_status(engine, "done") == 2000), timeout=60)
    finally:
        for w in workers:
            await w.stop()
    assert set(runs) == set(ids)
    assert max(runs.values()) == 1 and not overlaps
    assert all(w.claimed > 0 for w in workers)


async def test_a_saturated_worker_claims_freed_slots_together(engine, async_engine, libpq,
                                                             tenant):
    registry = Registry()

    @registry.handler("reindex")
    async def staggered(job: Job) -> None:
        # Runs of different lengths end one at a time, about 3 ms apart.
        await asyncio.sleep(0.02 + (job.payload["i"] % 20) * 0.003)

    from postrelay.queue import JobSpec, enqueue_many

    with engine.begin() as conn:
        enqueue_many(conn, [JobSpec("reindex", {"i": i}, tenant) for i in range(200)])
    await run_until(async_engine, libpq, registry,
                    lambda: count_status(engine, "done") == 200, concurrency=20)
    with engine.connect() as conn:
        claims = conn.execute(text(
            "SELECT count(DISTINCT claimed_at) FROM mdm.aa_job")).scalar_one()
    # A claim per freed slot would be about one per job after the first 20; gathering two
    # slots (a tenth of the concurrency) at a time takes about half of that.
    assert claims <= 120, claims


def claim_sizes(engine) -> list[int]:
    """Jobs per claim statement: each claim stamps its rows with its transaction's now()."""
    with engine.connect() as conn:
        return list(conn.execute(text(
            "SELECT count(*) FROM mdm.aa_job GROUP BY claimed_at ORDER BY claimed_at"
        )).scalars())


async def test_a_worker_with_short_jobs_claims_ahead_but_runs_only_its_concurrency(
        engine, async_engine, libpq, tenant):
    registry = Registry()
    active: set = set()
    most_active = 0

    @registry.handler("reindex")
    async def quick(job: Job) -> None:
        nonlocal most_active
        active.add(job.id)
        most_active = max(most_active, len(active))
        await asyncio.sleep(0)
        active.discard(job.id)

    from postrelay.queue import JobSpec, enqueue_many

    with engine.begin() as conn:
        enqueue_many(conn, [JobSpec("reindex", {"i": i}, tenant) for i in range(600)])
    await run_until(async_engine, libpq, registry,
                    lambda: count_status(engine, "done") == 600, concurrency=2)
    sizes = claim_sizes(engine)
    assert sizes[0] == 2, sizes  # nothing known of the jobs yet: free slots only
    assert max(sizes) > 2 and len(sizes) < 150, sizes  # then claims carry jobs held ahead
    assert max(sizes) <= 2 + 2 * 9, sizes  # at most nine ahead per slot
    assert most_active == 2, most_active  # held jobs wait for a slot


async def test_claiming_ahead_switched_off_claims_only_free_slots(
        engine, async_engine, libpq, tenant):
    registry = Registry()

    @registry.handler("reindex")
    async def quick(job: Job) -> None:
        pass

    from postrelay.queue import JobSpec, enqueue_many

    with engine.begin() as conn:
        enqueue_many(conn, [JobSpec("reindex", {"i": i}, tenant) for i in range(100)])
    await run_until(async_engine, libpq, registry,
                    lambda: count_status(engine, "done") == 100, concurrency=2,
                    claim_ahead_secs=0)
    assert max(claim_sizes(engine)) <= 2


async def test_slow_jobs_are_not_claimed_ahead(engine, async_engine, libpq, tenant):
    registry = Registry()

    @registry.handler("reindex")
    async def slow(job: Job) -> None:
        await asyncio.sleep(0.05)  # five times the claim-ahead horizon of 10 ms

    from postrelay.queue import JobSpec, enqueue_many

    with engine.begin() as conn:
        enqueue_many(conn, [JobSpec("reindex", {"i": i}, tenant) for i in range(8)])
    await run_until(async_engine, libpq, registry,
                    lambda: count_status(engine, "done") == 8, concurrency=1)
    assert claim_sizes(engine) == [1] * 8


async def test_stop_hands_back_jobs_held_ahead_unrun_and_uncounted(
        engine, async_engine, libpq, tenant):
    registry = Registry()
    started: list = []

    @registry.handler("reindex")
    async def quick_then_stuck(job: Job) -> None:
        if job.payload["stuck"]:
            started.append(job.id)
            await asyncio.sleep(3600)

    from postrelay.queue import JobSpec, enqueue_many

    metrics = WorkerMetrics()
    worker = make_worker(async_engine, libpq, registry, concurrency=1, grace_secs=0.2,
                         metrics=metrics)
    await worker.start()
    try:
        with engine.begin() as conn:  # short runs teach the worker to claim ahead
            enqueue_many(conn, [JobSpec("reindex", {"stuck": False}, tenant)] * 50)
        await wait_until(lambda: _async(count_status(engine, "done") == 50))
        with engine.begin() as conn:
            stuck = enqueue_many(conn, [JobSpec("reindex", {"stuck": True}, tenant)] * 20)
        await wait_until(lambda: _async(len(started) == 1))
        held = worker.running_ids - set(started)
        assert 1 <= len(held) <= 9 and held <= set(stuck)
        assert gauge(metrics, "postrelay_worker_held_jobs") == len(held)
        assert gauge(metrics, "postrelay_worker_running_jobs") == 1
    finally:
        await worker.stop()
    assert len(started) == 1  # the held jobs never ran
    assert gauge(metrics, "postrelay_worker_held_jobs") == 0
    returned = metrics.registry.get_sample_value(
        "postrelay_jobs_finished_total", {"kind": "reindex", "status": "returned"})
    assert returned == len(held) + 1  # the held ones and the one cut short
    for job_id in stuck:  # every one pending again, no attempt counted
        assert job_row_attempts(engine, job_id) == (0, "pending")
    assert count_status(engine, "running") == 0


async def test_jobs_held_behind_a_long_run_are_handed_back_for_other_workers(
        engine, async_engine, libpq, tenant):
    registry = Registry()
    stuck_started = asyncio.Event()

    @registry.handler("reindex")
    async def quick_or_stuck(job: Job) -> None:
        if job.payload["stuck"]:
            stuck_started.set()
            await asyncio.sleep(3600)

    from postrelay.queue import JobSpec, enqueue_many

    # Held jobs are handed back after 100 x claim_ahead_secs: 0.2 s here.
    first = make_worker(async_engine, libpq, registry, concurrency=1, grace_secs=0.2,
                        claim_ahead_secs=0.002)
    second = make_worker(async_engine, libpq, registry, concurrency=1, grace_secs=0.2)
    await first.start()
    try:
        with engine.begin() as conn:  # short runs teach the first worker to claim ahead
            enqueue_many(conn, [JobSpec("reindex", {"stuck": False}, tenant)] * 50)
        await wait_until(lambda: _async(count_status(engine, "done") == 50))
        with engine.begin() as conn:  # a long run first, short ones behind it
            stuck, *quick = enqueue_many(conn, [
                JobSpec("reindex", {"stuck": True}, tenant, priority=1),
                *[JobSpec("reindex", {"stuck": False}, tenant)] * 5,
            ])
        await asyncio.wait_for(stuck_started.wait(), 10)
        assert first.running_ids == {stuck, *quick}  # the short ones held for the slot
        await wait_until(lambda: _async(all(
            job_row_attempts(engine, job_id) == (0, "pending") for job_id in quick)))
        assert first.running_ids == {stuck}
        await second.start()  # an idle worker takes them while the long run goes on
        await wait_until(lambda: _async(count_status(engine, "done") == 55))
        with engine.connect() as conn:
            rows = [job_row(conn, job_id) for job_id in quick]
        assert {row["claimed_by"] for row in rows} == {second.id}
        assert {row["attempts"] for row in rows} == {1}  # the held claim was not counted
        assert job_row_attempts(engine, stuck) == (1, "running")
    finally:
        await second.stop()
        await first.stop()


def gauge(metrics: WorkerMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)


def count_status(engine, status: str) -> int:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM mdm.aa_job WHERE status = CAST(:s AS mdm.job_status)"),
            {"s": status},
        ).scalar_one()


async def test_priority_then_available_at_order(engine, async_engine, libpq, tenant):
    registry = Registry()
    order: list[str] = []

    @registry.handler("reindex")
    async def record(job: Job) -> None:
        order.append(job.payload["name"])

    with engine.begin() as conn:
        enqueue(conn, "reindex", {"name": "late"}, tenant_id=tenant, priority=100)
    with engine.begin() as conn:
        enqueue(conn, "reindex", {"name": "urgent"}, tenant_id=tenant, priority=1)
    worker = make_worker(async_engine, libpq, registry, concurrency=1)
    await worker.start()
    try:
        await wait_until(lambda: _async(len(order) == 2))
    finally:
        await worker.stop()
    assert order == ["urgent", "late"]


async def test_delayed_job_starts_when_due_not_a_poll_later(engine, async_engine, libpq, tenant):
    registry = Registry()
    started: list[float] = []

    @registry.handler("reindex")
    async def record(job: Job) -> None:
        started.append(time.monotonic())

    worker = make_worker(async_engine, libpq, registry, poll_interval_secs=30)
    await worker.start()
    try:
        await asyncio.sleep(0.2)
        t0 = time.monotonic()
        with engine.begin() as conn:
            enqueue(conn, "reindex", {}, tenant_id=tenant, delay=0.5)
        await wait_until(lambda: _async(bool(started)), timeout=10)
    finally:
        await worker.stop()
    waited = started[0] - t0
    assert 0.45 <= waited < 5, waited  # due after 0.5 s; the poll interval is 30 s


async def test_tenant_and_kind_filters(engine, async_engine, libpq, tenant):
    from postrelay.queue import ensure_tenant

    registry = Registry()
    seen: list[tuple[str, str]] = []

    @registry.handler("reindex")
    async def a(job: Job) -> None:
        seen.append(("reindex", str(job.tenant_id)))

    @registry.handler("bulk_import")
    async def b(job: Job) -> None:
        seen.append(("bulk_import", str(job.tenant_id)))

    with engine.begin() as conn:
        other = ensure_tenant(conn, "other")
        enqueue(conn, "reindex", {}, tenant_id=tenant)
        enqueue(conn, "bulk_import", {}, tenant_id=tenant)
        enqueue(conn, "reindex", {}, tenant_id=other)
    worker = make_worker(async_engine, libpq, registry, tenants=(tenant,), kinds=("reindex",))
    await worker.start()
    try:
        await wait_until(lambda: _async(len(seen) >= 1))
        await asyncio.sleep(0.3)
    finally:
        await worker.stop()
    assert seen == [("reindex", str(tenant))]


async def test_stop_hands_back_unfinished_jobs_uncounted(engine, async_engine, libpq, tenant):
    registry = Registry()
    started = asyncio.Event()

    @registry.handler("reindex")
    async def forever(job: Job) -> None:
        started.set()
        await asyncio.sleep(3600)

    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {}, tenant_id=tenant)
    worker = make_worker(async_engine, libpq, registry, grace_secs=0.2)
    await worker.start()
    await asyncio.wait_for(started.wait(), 10)
    assert job_row_attempts(engine, job_id) == (1, "running")
    await worker.stop()
    assert job_row_attempts(engine, job_id) == (0, "pending")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_worker")).scalar_one() == 0


async def test_stop_lets_running_jobs_finish_within_grace(engine, async_engine, libpq, tenant):
    registry = Registry()
    started = asyncio.Event()

    @registry.handler("reindex")
    async def short(job: Job) -> None:
        started.set()
        await asyncio.sleep(0.3)

    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {}, tenant_id=tenant)
    worker = make_worker(async_engine, libpq, registry, grace_secs=5)
    await worker.start()
    await asyncio.wait_for(started.wait(), 10)
    await worker.stop()
    assert job_row_attempts(engine, job_id) == (1, "done")


async def test_a_claim_whose_reply_was_lost_is_handed_back(engine, async_engine, libpq, tenant):
    from datetime import timedelta

    from postrelay.core.clock import utcnow
    from tests.factories import insert_job

    registry = Registry()

    @registry.handler("reindex")
    async def noop(job: Job) -> None:
        pass

    worker = make_worker(async_engine, libpq, registry, lease_secs=0.5, poll_interval_secs=30)
    with engine.begin() as conn:  # what a claim leaves when its COMMIT reply never arrives
        lost = insert_job(conn, tenant_id=tenant, status="running", attempts=1,
                          claimed_by=worker.id, claimed_at=utcnow() - timedelta(seconds=5))
    await worker.start()
    try:
        await wait_until(lambda: _async(status_of(engine, lost) == "done"), timeout=10)
    finally:
        await worker.stop()
    assert job_row_attempts(engine, lost) == (1, "done")  # handed back uncounted, run once
