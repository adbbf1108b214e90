"""Rows that SQL written by hand (another service's, in another language, or an operator's)
can hold and postrelay's own calls never write: they must not stop the worker."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from sqlalchemy import text

from postrelay.queue import Registry, enqueue
from postrelay.queue.model import Job
from tests.factories import insert_job
from tests.integration.worker_helpers import as_awaitable, make_worker, run_until, wait_until

HUGE_INTEGER = '{"n": ' + "7" * 5000 + "}"
DEEP = '{"n": ' + "[" * 3000 + "]" * 3000 + "}"


async def test_a_payload_python_cannot_read_is_dead_lettered_and_the_rest_run(
        engine, async_engine, libpq, tenant):
    """An integer of more digits than Python converts, or nesting deeper than its decoder's
    recursion: one such row failed the whole claim after it had committed, so it and the
    jobs claimed with it stayed `running`, and the rescuer handed them back to be claimed
    and fail again, for ever."""
    registry = Registry()
    ran: list[Job] = []

    @registry.handler("reindex")
    async def reindex(job: Job) -> None:
        ran.append(job)

    with engine.begin() as conn:
        good = insert_job(conn, tenant_id=tenant, payload={"n": 1})
        unreadable = {}
        for name, payload in (("huge", HUGE_INTEGER), ("deep", DEEP)):
            unreadable[name] = insert_job(conn, tenant_id=tenant)
            conn.execute(text("UPDATE mdm.aa_job SET payload = CAST(:p AS jsonb) WHERE id = :id"),
                         {"p": payload, "id": unreadable[name]})

    def settled() -> bool:
        with engine.begin() as conn:
            settled = conn.execute(text(
                "SELECT count(*) FROM mdm.aa_job WHERE status IN ('done', 'dlq')")).scalar_one()
        return settled == 3

    await run_until(async_engine, libpq, registry, settled)

    assert [job.id for job in ran] == [good] and ran[0].payload == {"n": 1}
    with engine.begin() as conn:
        assert state(conn, good)["status"] == "done"
        rows = {name: state(conn, job_id) for name, job_id in unreadable.items()}
        for row in rows.values():
            assert row["status"] == "dlq" and row["attempts"] == 1
            assert "the job's payload cannot be read" in row["last_error"]
        assert "5000 digits" in rows["huge"]["last_error"]
        assert "RecursionError" in rows["deep"]["last_error"]
        # Kept as it was, for an operator to mend and retry.
        stored = conn.execute(text("SELECT length(payload::text) FROM mdm.aa_job WHERE id = :id"),
                              {"id": unreadable["huge"]}).scalar_one()
    assert stored == len(HUGE_INTEGER)


def state(conn, job_id):
    """The row without its payload, which the driver cannot read either."""
    return conn.execute(text("SELECT status::text AS status, attempts, last_error "
                             "FROM mdm.aa_job WHERE id = :id"), {"id": job_id}).mappings().one()


async def test_a_job_parked_at_infinity_does_not_stop_the_idle_worker_claiming(
        engine, async_engine, libpq, tenant, caplog):
    """available_at 'infinity' parks a job for good. An idle worker asks how soon the next
    job is due, and the subtraction failed: every idle round was a failed claim, its backoff
    growing, so new work waited for it. A job at '-infinity' (due at once) is claimed and
    runs: the driver cannot read that time, so it reads as the job's creation."""
    registry = Registry()
    ran: list[Job] = []

    @registry.handler("reindex")
    async def reindex(job: Job) -> None:
        ran.append(job)

    with engine.begin() as conn:
        parked, early = insert_job(conn, tenant_id=tenant), insert_job(conn, tenant_id=tenant)
        for job_id, at in ((parked, "infinity"), (early, "-infinity")):
            conn.execute(text("UPDATE mdm.aa_job SET available_at = CAST(:at AS timestamptz) "
                              "WHERE id = :id"), {"at": at, "id": job_id})
    caplog.set_level(logging.INFO)
    worker = make_worker(async_engine, libpq, registry)
    await worker.start()
    try:
        await wait_until(lambda: as_awaitable([job.id for job in ran] == [early]))
        assert ran[0].available_at == ran[0].created_at
        await asyncio.sleep(1.0)  # idle rounds, each asking when the next job is due
        with engine.begin() as conn:
            fresh = enqueue(conn, "reindex", {"n": 1}, tenant_id=tenant)
        await wait_until(lambda: as_awaitable([job.id for job in ran] == [early, fresh]))
    finally:
        await worker.stop()
    assert [r.getMessage() for r in caplog.records
            if "claim_failed" in r.getMessage()] == []
    with engine.begin() as conn:
        assert state(conn, parked)["status"] == "pending"


async def test_jobs_created_at_infinity_run_with_the_rest(engine, async_engine, libpq, tenant,
                                                           caplog):
    """The claim read created_at as Python's datetime, which has no infinity: a job written
    at created_at 'infinity' or '-infinity' (or past year 9999) failed every claim that took
    it, after the claim had committed, so it and the jobs claimed with it stayed `running`
    until the rescuer handed them back, to fail again."""
    registry = Registry()
    ran: dict[object, Job] = {}

    @registry.handler("reindex")
    async def reindex(job: Job) -> None:
        ran[job.id] = job

    with engine.begin() as conn:
        jobs = {at: insert_job(conn, tenant_id=tenant)
                for at in ("infinity", "-infinity", "12000-01-01", "now")}
        for at, job_id in jobs.items():
            conn.execute(text("UPDATE mdm.aa_job SET created_at = CAST(:at AS timestamptz) "
                              "WHERE id = :id"), {"at": at, "id": job_id})
        # Due at '-infinity' as well: the claim reads such a due time as the creation.
        conn.execute(text("UPDATE mdm.aa_job SET available_at = '-infinity' WHERE id = :id"),
                     {"id": jobs["-infinity"]})
    caplog.set_level(logging.INFO)
    await run_until(async_engine, libpq, registry, lambda: len(ran) == len(jobs))
    assert ran[jobs["infinity"]].created_at == datetime.max.replace(tzinfo=UTC)
    assert ran[jobs["12000-01-01"]].created_at == datetime.max.replace(tzinfo=UTC)
    assert ran[jobs["-infinity"]].created_at == datetime.min.replace(tzinfo=UTC)
    assert ran[jobs["-infinity"]].available_at == datetime.min.replace(tzinfo=UTC)
    assert [r.getMessage() for r in caplog.records
            if "claim_failed" in r.getMessage()] == []
