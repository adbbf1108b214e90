"""Handlers that end their process or will not end, in real worker processes: `sys.exit`
is the job's failed attempt and the worker goes on; `os._exit` kills the process at once,
and the rescuer brings the job back after the lease, for another worker to finish; a run,
or a task a handler left behind, that ignores its cancel does not keep SIGTERM from
ending the process."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from postrelay.queue import enqueue
from tests.acceptance.conftest import (
    WorkerPool,
    audit_actions,
    finished,
    job_state,
    starts,
    wait_for,
)
from tests.factories import job_row

pytestmark = pytest.mark.acceptance


def test_sys_exit_in_a_handler_fails_the_attempt_and_the_worker_goes_on(
    workers: WorkerPool, engine, tenant, marks: Path
):
    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {"dir": str(marks), "exit_on_attempts": [1]},
                         tenant_id=tenant)
    worker = workers.start()
    wait_for(lambda: job_state(engine, job_id)[0] == "done", what="the job to be done")
    assert worker.alive
    with engine.connect() as conn:
        row = job_row(conn, job_id)
    # Counted: a job that exits every time reaches the DLQ instead of taking down every
    # worker that claims it.
    assert row["attempts"] == 2 and "SystemExit: 3" in row["last_error"]
    assert starts(marks, job_id) == [(1, worker.pid), (2, worker.pid)]
    assert finished(marks) == {worker.pid: [str(job_id)]}
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_os_exit_in_a_handler_is_a_crash_whose_job_is_rescued(
    workers: WorkerPool, engine, tenant, marks: Path
):
    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {"dir": str(marks), "crash_on_attempts": [1]},
                         tenant_id=tenant)
    doomed = workers.start()
    assert doomed.wait() == 3  # no shutdown code ran: the claim is left behind
    assert job_state(engine, job_id) == ("running", 1)
    survivor = workers.start()
    wait_for(lambda: job_state(engine, job_id)[0] == "done", what="the job to be done")
    assert job_state(engine, job_id) == ("done", 2)
    assert starts(marks, job_id) == [(1, doomed.pid), (2, survivor.pid)]
    assert [action for action, _ in audit_actions(engine, job_id)] == ["job_rescued"]


def test_a_task_a_handler_left_ignoring_its_cancel_does_not_hold_the_process(
    workers: WorkerPool, engine, tenant, marks: Path
):
    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {"dir": str(marks), "leak_task": True},
                         tenant_id=tenant)
    worker = workers.start()
    wait_for(lambda: job_state(engine, job_id)[0] == "done", what="the job to be done")
    worker.send(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0  # was: never, waiting for the task
    assert "postrelay.process.tasks_abandoned count=1 names=leaked-by-a-handler" in worker.log()


def test_a_run_that_ignores_its_cancel_is_left_to_the_rescuer_and_the_process_ends(
    workers: WorkerPool, engine, tenant, marks: Path
):
    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex",
                         {"dir": str(marks), "ignore_cancel_on_attempts": [1]},
                         tenant_id=tenant)
    stubborn = workers.start()
    wait_for(lambda: starts(marks, job_id), what="the first run to start")
    stubborn.send(signal.SIGTERM)
    assert stubborn.wait(timeout=30) == 0  # grace 2 s, 5 s for the run, 5 s for its task
    assert job_state(engine, job_id) == ("running", 1)  # not handed back: it may be at work
    assert "postrelay.worker.runs_abandoned count=1" in stubborn.log()
    survivor = workers.start()
    wait_for(lambda: job_state(engine, job_id)[0] == "done", what="the job to be done")
    assert job_state(engine, job_id) == ("done", 2)
    assert starts(marks, job_id) == [(1, stubborn.pid), (2, survivor.pid)]
    assert [action for action, _ in audit_actions(engine, job_id)] == ["job_rescued"]


def test_a_call_a_handler_left_in_a_thread_does_not_hold_the_process(
    workers: WorkerPool, engine, tenant, marks: Path
):
    """A thread cannot be stopped, and the interpreter's exit waits for every thread of the
    loop's pool: the worker stayed after SIGTERM until killed."""
    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {"dir": str(marks), "leak_thread": True},
                         tenant_id=tenant)
    worker = workers.start()
    wait_for(lambda: job_state(engine, job_id)[0] == "done", what="the job to be done")
    worker.send(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert "postrelay.process.threads_abandoned count=1" in worker.log()
