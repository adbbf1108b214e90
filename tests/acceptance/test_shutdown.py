"""SIGTERM on a real worker process: stop claiming, let running jobs finish within the
grace period, hand the rest back uncounted, exit 0."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from postrelay.queue import enqueue
from tests.acceptance.conftest import (
    WorkerPool,
    finished,
    job_state,
    registered,
    starts,
    wait_for,
    wait_registered,
)
from tests.factories import job_row

pytestmark = pytest.mark.acceptance

GRACE_SECS = 2.0


def test_sigterm_lets_short_job_finish_and_hands_long_one_back_uncounted(
    workers: WorkerPool, engine, tenant, marks: Path
):
    proc = workers.start(concurrency=4, env={"POSTRELAY_WORKER_GRACE_SECS": str(GRACE_SECS)})
    wait_registered(engine, proc)
    with engine.begin() as conn:
        short = enqueue(conn, "reindex", {"dir": str(marks), "sleep": 1}, tenant_id=tenant)
        long = enqueue(conn, "reindex", {"dir": str(marks), "sleep": 3600}, tenant_id=tenant)
    wait_for(lambda: starts(marks, short) and starts(marks, long), what="both jobs to start")
    assert finished(marks) == {}  # the short job is still running when the signal arrives

    proc.send(signal.SIGTERM)
    signalled = time.monotonic()
    assert proc.wait() == 0
    took = time.monotonic() - signalled
    # It waited for the short job (1 s), and gave up on the long one after the grace period.
    assert 0.5 < took < GRACE_SECS + 5, took
    assert job_state(engine, short) == ("done", 1)
    assert finished(marks) == {proc.pid: [str(short)]}
    # Handed back with the claim's attempt refunded, due at once: its next run is attempt 1.
    assert job_state(engine, long) == ("pending", 0)
    with engine.connect() as conn:
        assert conn.execute(
            text("SELECT available_at <= now() FROM mdm.aa_job WHERE id = :id"), {"id": long}
        ).scalar_one()
    assert registered(engine, proc) == {}  # deregistered on the way out
    assert "postrelay.worker.stopped" in proc.log()


def test_sigterm_stops_claiming_before_anything_else(
    workers: WorkerPool, engine, tenant, marks: Path
):
    proc = workers.start(concurrency=4)
    worker_id = wait_registered(engine, proc)[proc.pid]
    wait_for(lambda: lease_holder(engine) == worker_id, what="the worker to lead maintenance")

    # Hold the maintenance lease row, so that the shutdown pauses where it gives the lease
    # back — as it would on a slow database — and the pause can be watched.
    with engine.connect() as holder:
        holder.execute(text("SELECT 1 FROM mdm.aa_lease FOR UPDATE"))
        proc.send(signal.SIGTERM)
        wait_for(lambda: waiting_on(engine, "DELETE FROM mdm.aa_lease"),
                 what="the shutdown to reach the lease release")
        with engine.begin() as conn:  # a free slot and a NOTIFY: a claiming worker takes it
            late = enqueue(conn, "reindex", {"dir": str(marks)}, tenant_id=tenant)
        claimed = claimed_within(engine, late, secs=1.0)  # five poll intervals
        holder.rollback()
    assert proc.wait() == 0

    assert not claimed, "a job enqueued after SIGTERM was claimed"
    with engine.connect() as conn:
        row = job_row(conn, late)
    assert (row["state"], row["attempts"], row["claimed_by"]) == ("pending", 0, None)
    assert starts(marks, late) == []


def lease_holder(engine) -> str | None:
    with engine.connect() as conn:
        return conn.execute(text("SELECT holder FROM mdm.aa_lease")).scalar_one_or_none()


def waiting_on(engine, statement: str) -> bool:
    """Whether a backend of this database is waiting for a lock in `statement`."""
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) > 0 FROM pg_stat_activity "
                 "WHERE datname = current_database() AND wait_event_type = 'Lock' "
                 "AND starts_with(query, :statement)"),
            {"statement": statement},
        ).scalar_one()


def claimed_within(engine, job_id, *, secs: float) -> bool:
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if job_row(conn, job_id)["claimed_by"] is not None:
                return True
        time.sleep(0.05)
    return False
