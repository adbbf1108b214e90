"""Cancelling a job a real worker process is running: the handler's task is cancelled
within a second, the job ends `failed` with who and when, and it is never run again."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from postrelay.queue import enqueue
from postrelay.queue.admin import job_cancel
from tests.acceptance.conftest import (
    WorkerPool,
    job_state,
    registered,
    starts,
    wait_for,
    wait_registered,
)

pytestmark = pytest.mark.acceptance


def _cancelled_marks(marks: Path, job_id) -> list[Path]:
    return list(marks.glob(f"cancelled.{job_id}.*"))


@pytest.mark.parametrize("pooler", ["none", "transaction"])
def test_cancelling_a_running_job_stops_its_handler_within_a_second_and_it_is_not_retried(
    workers: WorkerPool, engine, tenant, marks: Path, pooler: str
):
    # POSTRELAY_POOLER=transaction: no LISTEN anywhere; the worker learns by polling.
    proc = workers.start(concurrency=2, env={"POSTRELAY_POOLER": pooler})
    wait_registered(engine, proc)
    with engine.begin() as conn:
        long = enqueue(conn, "reindex", {"dir": str(marks), "sleep": 3600}, tenant_id=tenant,
                       max_attempts=5)
        other = enqueue(conn, "reindex", {"dir": str(marks), "sleep": 0.5}, tenant_id=tenant)
    wait_for(lambda: starts(marks, long), what="the long job to start")

    with engine.begin() as conn:
        cancelled = job_cancel(conn, long, actor="ops:alice")
    asked = time.monotonic()
    assert cancelled.was == "running"
    wait_for(lambda: _cancelled_marks(marks, long), timeout=5, what="the handler to be cancelled")
    assert time.monotonic() - asked < 1.0 + 0.3  # check period 0.5 s, plus scheduling slack

    assert job_state(engine, long) == ("failed", 1)
    wait_for(lambda: job_state(engine, other)[0] == "done", what="the other job to finish")
    time.sleep(1.5)  # a retry, were there one, would start at once (backoff 0.05 s)
    assert job_state(engine, long) == ("failed", 1)
    assert len(starts(marks, long)) == 1
    with engine.connect() as conn:
        error = conn.execute(text("SELECT last_error FROM mdm.aa_job WHERE id = :id"),
                             {"id": long}).scalar_one()
        audit = conn.execute(text(
            "SELECT action, actor, detail->>'was' FROM mdm.aa_job_audit WHERE job_id = :id"),
            {"id": long}).all()
        requests = conn.execute(text("SELECT count(*) FROM mdm.aa_job_cancel")).scalar_one()
    assert error.startswith("cancelled by ops:alice at ") and error.endswith("while running")
    assert audit == [("job_cancelled", "ops:alice", "running")]
    assert requests == 0  # the worker took its request
    assert "postrelay.worker.job_cancelled" in proc.log()


def test_a_cancel_asked_while_its_worker_was_stopped_still_stops_the_run_when_it_resumes(
    workers: WorkerPool, engine, tenant, marks: Path
):
    """A worker stopped longer than the lease (SIGSTOP here; a frozen VM, a long GC pause, a
    network partition in life) has its row pruned by the leader, and the cancel requests
    addressed to it were pruned with it as if it had died. It had not: it came back,
    registered again and ran the cancelled job's handler to its end (here, for an hour)."""
    stopped = workers.start(concurrency=2)
    stopped_id = wait_registered(engine, stopped)[stopped.pid]
    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {"dir": str(marks), "sleep": 3600}, tenant_id=tenant)
    wait_for(lambda: starts(marks, job_id), what="the job to start")
    leader = workers.start(concurrency=1)  # leads once the stopped one's lock is let go
    wait_registered(engine, leader)

    stopped.send(signal.SIGSTOP)
    try:
        with engine.begin() as conn:
            assert job_cancel(conn, job_id, actor="ops:alice").was == "running"

        def pruned() -> bool:
            with engine.connect() as conn:
                return conn.execute(text(
                    "SELECT NOT EXISTS (SELECT 1 FROM mdm.aa_worker WHERE id = :id)"
                    " AND NOT EXISTS (SELECT 1 FROM mdm.aa_job_cancel)"),
                    {"id": stopped_id}).scalar_one()

        wait_for(pruned, timeout=20, what="the leader to prune the stopped worker's row")
    finally:
        stopped.send(signal.SIGCONT)
    wait_for(lambda: _cancelled_marks(marks, job_id), timeout=10,
             what="the resumed worker to stop the cancelled run")
    assert stopped.alive
    assert registered(engine, stopped) == {stopped.pid: stopped_id}  # back, same id
    assert job_state(engine, job_id) == ("failed", 1)
    assert len(starts(marks, job_id)) == 1
    assert "postrelay.worker.job_cancelled" in stopped.log()
