"""The worker against a real PostgreSQL: outcomes, retries, DLQ, timeouts, shutdown."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from sqlalchemy import text

from postrelay.queue import PermanentError, Registry, RetryAfter, StopJob, enqueue
from postrelay.queue.backoff import FixedBackoff
from postrelay.queue.model import Job
from tests.factories import audit_rows, job_row
from tests.integration.worker_helpers import (
    as_awaitable,
    count_status,
    job_row_attempts,
    make_worker,
    run_until,
    wait_until,
)


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
        await wait_until(lambda: as_awaitable(status_of(engine, job_id) == "done"))
    finally:
        await worker.stop()
    with engine.connect() as conn:
        row = job_row(conn, job_id)
    assert row["attempts"] == 1 and row["completed_at"] is not None
    assert row["claimed_by"] == worker.id and worker.id.count("/") == 2
    assert [j.payload for j in seen] == [payload] and seen[0].attempts == 1


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
        await wait_until(lambda: as_awaitable(status_of(engine, job_id) == "dlq"))
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
        await wait_until(lambda: as_awaitable(job_row_attempts(engine, job_id) == (1, "pending")))
    finally:
        await worker.stop()
    with engine.connect() as conn:
        row = job_row(conn, job_id)
        now = conn.execute(text("SELECT now()")).scalar_one()
    assert 50 < (row["available_at"] - now).total_seconds() <= 60
    assert len(row["last_error"].encode()) <= 4096


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
        await wait_until(lambda: as_awaitable(
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
        await wait_until(lambda: as_awaitable(status_of(engine, job_id) == "dlq"))
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
        await wait_until(lambda: as_awaitable(count_status(engine, "done") == 2000), timeout=60)
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
    # A claim per freed slot would be about one per job after the first 20. These runs are
    # longer than claim_ahead_secs, so freed slots gather up to half the concurrency (a
    # quarter, for short runs, made about 31 claims here; half, about 20).
    assert claims <= 25, claims


@pytest.mark.parametrize("merged", [False, True], ids=["own", "merged"])
async def test_a_claim_hook_hears_of_its_kinds_jobs_before_they_run(engine, async_engine,
                                                                   libpq, tenant, merged):
    """Each claim's jobs of the kind, before any of them runs, also through a merge (as
    runtime.py builds the worker's); a hook that raises costs nothing but itself."""
    registry = Registry()
    told: list[list[int]] = []
    started: list[int] = []
    ran_before_told: list[int] = []

    def hook(jobs) -> None:  # noqa: ANN001
        told.append([job.payload["i"] for job in jobs])
        ran_before_told.extend(set(told[-1]) & set(started))
        raise RuntimeError("a head start that failed")

    async def run(job: Job) -> None:
        started.append(job.payload["i"])
        await asyncio.sleep(0.01)

    async def other(job: Job) -> None:
        pass

    registry.register("reindex", run, on_claim=hook)
    registry.register("email_send", other)
    registry = Registry().merged(registry) if merged else registry
    from postrelay.queue import JobSpec, enqueue_many

    with engine.begin() as conn:
        enqueue_many(conn, [JobSpec("reindex", {"i": i}, tenant) for i in range(30)]
                     + [JobSpec("email_send", {"i": -1}, tenant) for _ in range(5)])
    await run_until(async_engine, libpq, registry,
                    lambda: count_status(engine, "done") == 35, concurrency=4)
    assert sorted(i for batch in told for i in batch) == list(range(30))
    assert sorted(started) == list(range(30)) and ran_before_told == []


def test_a_claim_hook_must_not_be_a_coroutine():
    from postrelay.core.errors import ValidationError

    async def run(job: Job) -> None:
        pass

    async def hook(jobs) -> None:  # noqa: ANN001
        pass

    try:
        Registry().register("reindex", run, on_claim=hook)
    except ValidationError as exc:
        assert exc.field == "on_claim"
    else:
        raise AssertionError("an async claim hook was accepted")


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
        await wait_until(lambda: as_awaitable(len(order) == 2))
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
        await wait_until(lambda: as_awaitable(bool(started)), timeout=10)
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
        await wait_until(lambda: as_awaitable(len(seen) >= 1))
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
        await wait_until(lambda: as_awaitable(status_of(engine, lost) == "done"), timeout=10)
    finally:
        await worker.stop()
    assert job_row_attempts(engine, lost) == (1, "done")  # handed back uncounted, run once
