"""Claiming ahead of free slots against a real PostgreSQL: how many jobs a claim carries,
how many run at once, and what becomes of jobs held for a slot."""

from __future__ import annotations

import asyncio
import time

from sqlalchemy import text

from postrelay.queue import JobSpec, Registry, enqueue_many
from postrelay.queue.metrics import WorkerMetrics
from postrelay.queue.model import Job
from tests.factories import job_row
from tests.integration.worker_helpers import (
    as_awaitable,
    count_status,
    job_row_attempts,
    make_worker,
    run_until,
    wait_until,
)


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

    metrics = WorkerMetrics()
    worker = make_worker(async_engine, libpq, registry, concurrency=1, grace_secs=0.2,
                         metrics=metrics)
    await worker.start()
    try:
        with engine.begin() as conn:  # short runs teach the worker to claim ahead
            enqueue_many(conn, [JobSpec("reindex", {"stuck": False}, tenant)] * 50)
        await wait_until(lambda: as_awaitable(count_status(engine, "done") == 50))
        with engine.begin() as conn:
            stuck = enqueue_many(conn, [JobSpec("reindex", {"stuck": True}, tenant)] * 20)
        await wait_until(lambda: as_awaitable(len(started) == 1))
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

    # Held jobs are handed back after 100 x claim_ahead_secs: 0.2 s here.
    first = make_worker(async_engine, libpq, registry, concurrency=1, grace_secs=0.2,
                        claim_ahead_secs=0.002)
    second = make_worker(async_engine, libpq, registry, concurrency=1, grace_secs=0.2)
    await first.start()
    try:
        with engine.begin() as conn:  # short runs teach the first worker to claim ahead
            enqueue_many(conn, [JobSpec("reindex", {"stuck": False}, tenant)] * 50)
        await wait_until(lambda: as_awaitable(count_status(engine, "done") == 50))
        with engine.begin() as conn:  # a long run first, short ones behind it
            stuck, *quick = enqueue_many(conn, [
                JobSpec("reindex", {"stuck": True}, tenant, priority=1),
                *[JobSpec("reindex", {"stuck": False}, tenant)] * 5,
            ])
        await asyncio.wait_for(stuck_started.wait(), 10)
        assert first.running_ids == {stuck, *quick}  # the short ones held for the slot
        await wait_until(lambda: as_awaitable(all(
            job_row_attempts(engine, job_id) == (0, "pending") for job_id in quick)))
        assert first.running_ids == {stuck}
        await second.start()  # an idle worker takes them while the long run goes on
        await wait_until(lambda: as_awaitable(count_status(engine, "done") == 55))
        with engine.connect() as conn:
            rows = [job_row(conn, job_id) for job_id in quick]
        assert {row["claimed_by"] for row in rows} == {second.id}
        assert {row["attempts"] for row in rows} == {1}  # the held claim was not counted
        assert job_row_attempts(engine, stuck) == (1, "running")
    finally:
        await second.stop()
        await first.stop()


async def test_a_held_job_never_starts_after_the_hold_limit_when_a_slot_frees_late(
        engine, async_engine, libpq, tenant):
    """The slot frees after the limit but before the claim loop looks again: the held jobs
    go back (and are claimed afresh), none starts on the old claim."""
    registry = Registry()
    waits: list[float] = []  # from each run's claim to its start

    @registry.handler("reindex")
    async def quick_or_slow(job: Job) -> None:
        waits.append(time.time() - job.claimed_at.timestamp())
        await asyncio.sleep(job.payload["sleep"])

    # Held jobs are handed back after 100 x claim_ahead_secs: 0.2 s here. The claim loop,
    # saturated, sleeps for the poll interval: it does not look before the slot frees.
    worker = make_worker(async_engine, libpq, registry, concurrency=1, grace_secs=0.2,
                         claim_ahead_secs=0.002, poll_interval_secs=1.0)
    await worker.start()
    try:
        with engine.begin() as conn:  # short runs teach the worker to claim ahead
            enqueue_many(conn, [JobSpec("reindex", {"sleep": 0}, tenant)] * 50)
        await wait_until(lambda: as_awaitable(count_status(engine, "done") == 50))
        waits.clear()
        with engine.begin() as conn:  # a run longer than the limit, short ones behind it
            enqueue_many(conn, [JobSpec("reindex", {"sleep": 0.35}, tenant, priority=1),
                                *[JobSpec("reindex", {"sleep": 0}, tenant)] * 5])
        await wait_until(lambda: as_awaitable(count_status(engine, "done") == 56))
    finally:
        await worker.stop()
    assert len(waits) == 6
    assert max(waits) < 0.25, waits  # the limit, and a little for the clock and the loop


def gauge(metrics: WorkerMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)


async def test_jobs_a_claim_in_flight_brings_during_stop_are_handed_back(
        engine, async_engine, libpq, tenant):
    """A claim still waiting on the database when the stop began returned its jobs while the
    running one had its grace: held for a slot after the held jobs had been handed back, they
    stayed `running` under a worker that had gone, until the lease ran out (`postrelay demo`
    interrupted with Ctrl-C left them so)."""
    registry = Registry()
    started = asyncio.Event()

    @registry.handler("reindex")
    async def quick_or_stuck(job: Job) -> None:
        if job.payload["stuck"]:
            started.set()
            await asyncio.sleep(3600)

    worker = make_worker(async_engine, libpq, registry, concurrency=1, grace_secs=1.0,
                         poll_interval_secs=30)
    await worker.start()
    stopping = None
    try:
        with engine.begin() as conn:  # short runs teach the worker to claim ahead
            enqueue_many(conn, [JobSpec("reindex", {"stuck": False}, tenant)] * 50)
        await wait_until(lambda: as_awaitable(count_status(engine, "done") == 50))
        with engine.begin() as conn:
            enqueue_many(conn, [JobSpec("reindex", {"stuck": True}, tenant)])
        await asyncio.wait_for(started.wait(), 10)
        with engine.begin() as conn:  # no wake-up: the worker claims them when told below
            late = enqueue_many(conn, [JobSpec("reindex", {"stuck": False}, tenant)] * 5,
                                notify=False)
        with engine.connect() as holder, engine.connect() as watcher:
            holder.execute(text("LOCK TABLE mdm.aa_job IN EXCLUSIVE MODE"))
            worker._wake.set()  # claim now: it waits on the lock
            await wait_until(lambda: as_awaitable(watcher.execute(text(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = "
                "'mdm.aa_job'::regclass")).scalar_one() > 0))
            stopping = asyncio.create_task(worker.stop())
            await asyncio.sleep(0.2)  # the stop waits for the stuck run's grace
            holder.rollback()  # the claim goes through
    finally:
        await (stopping if stopping is not None else worker.stop())
    assert count_status(engine, "running") == 0
    for job_id in late:  # pending again, or run during the grace: never left claimed
        attempts, status = job_row_attempts(engine, job_id)
        assert (attempts, status) in {(0, "pending"), (1, "done")}
