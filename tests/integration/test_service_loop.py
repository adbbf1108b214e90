"""Real components on the one service shape, against PostgreSQL: maintenance backs off a
round the database refuses and rescues once it can; the worker's heartbeat is a run_once()
that returns what it did."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from postrelay.core.clock import utcnow
from postrelay.queue import Registry
from postrelay.queue.heartbeat import Beat
from postrelay.queue.maintenance import Maintenance, Rescuer
from tests.factories import insert_job, job_row
from tests.integration.worker_helpers import make_worker, wait_until

LEASE = 450.0


def round_failures(caplog, name: str) -> list[str]:
    return [r.fields["error"] for r in caplog.records if getattr(r, "event", None) == name]


async def test_maintenance_backs_off_a_failed_round_then_rescues(
    engine, database_url, tenant, caplog
):
    caplog.set_level(logging.WARNING, logger="postrelay")
    with engine.begin() as conn:
        stale = insert_job(conn, tenant_id=tenant, status="running", attempts=1,
                           claimed_by="host/1/dead", claimed_at=utcnow() - timedelta(hours=1))
    # A lock the rescuer cannot wait for: its rounds fail until the lock is gone.
    impatient = create_async_engine(database_url, connect_args={"options": "-c lock_timeout=50"})
    keeper = Maintenance(impatient, holder="keeper", interval_secs=0.05,
                         rescuer=Rescuer(impatient, lease_secs=LEASE, actor="keeper"))
    locker = engine.connect()
    try:
        locker.begin()
        locker.execute(text("LOCK TABLE mdm.aa_job IN ACCESS EXCLUSIVE MODE"))
        await keeper.start()
        deadline = time.monotonic() + 30  # a guard against a hang, not a timed claim
        while len(round_failures(caplog, "postrelay.maintenance.error")) < 2:
            assert time.monotonic() < deadline, "no failed round was logged"
            await asyncio.sleep(0.02)
        errors = round_failures(caplog, "postrelay.maintenance.error")
        assert all("LockNotAvailable" in e for e in errors), errors
        locker.rollback()  # the database serves again: the next round rescues the job

        async def rescued() -> bool:
            with engine.connect() as conn:
                return job_row(conn, stale)["state"] == "pending"

        await wait_until(rescued)
        assert keeper._loop.running  # the loop outlived its failed rounds
    finally:
        locker.close()
        await keeper.stop()
        await impatient.dispose()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_lease")).scalar_one() == 0


async def test_a_heartbeat_returns_what_it_did(engine, async_engine, libpq, tenant):
    registry = Registry()

    @registry.handler("reindex")
    async def reindex(job: object) -> None:
        pass

    worker = make_worker(async_engine, libpq, registry)
    await worker.start()
    try:
        assert await worker.heartbeat.run_once() == Beat(registered_again=False,
                                                         orphans_released=0)
        # Pruned while the database was away: the beat registers the worker again.
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM mdm.aa_worker WHERE id = :id"), {"id": worker.id})
        assert await worker.heartbeat.run_once() == Beat(registered_again=True,
                                                         orphans_released=0)
        # A job claimed under this worker's id that it does not hold goes back. Of a kind
        # this worker does not serve: a claim already under way when it stops claiming
        # would take a pending job of its own kinds back at once.
        with engine.begin() as conn:
            orphan = insert_job(conn, tenant_id=tenant, kind="bulk_import", status="running",
                                attempts=1, claimed_by=worker.id,
                                claimed_at=utcnow() - timedelta(hours=1))
        worker.stop_claiming()
        assert await worker.heartbeat.run_once() == Beat(registered_again=False,
                                                         orphans_released=1)
        with engine.connect() as conn:
            assert job_row(conn, orphan)["state"] == "pending"
            assert conn.execute(text("SELECT count(*) FROM mdm.aa_worker WHERE id = :id"),
                                {"id": worker.id}).scalar_one() == 1
    finally:
        await worker.stop()

