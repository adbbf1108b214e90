"""Delivery across real worker processes: a worker SIGKILLed mid-job loses nothing, a live
worker's long job is never taken from it, and concurrent processes run each job once."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import text

from postrelay.queue import JobSpec, enqueue, enqueue_many
from tests.acceptance.conftest import (
    TALLY_APP,
    WorkerPool,
    audit_actions,
    finished,
    job_state,
    starts,
    status_counts,
    wait_for,
    wait_registered,
)
from tests.factories import job_row

pytestmark = pytest.mark.acceptance

LEASE_SECS = 2.0  # FAST_SETTINGS' POSTRELAY_JOB_LEASE_SECS


def test_job_of_sigkilled_worker_is_rescued_after_lease_and_finished_by_another(
    workers: WorkerPool, engine, tenant, marks: Path
):
    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {"dir": str(marks), "hang_on_attempts": [1]},
                         tenant_id=tenant)
    doomed = workers.start()
    wait_for(lambda: starts(marks, job_id), what="the first run to start")
    with engine.connect() as conn:
        claimed = job_row(conn, job_id)
    assert (claimed["state"], claimed["attempts"]) == ("running", 1)
    assert f"/{doomed.pid}/" in claimed["claimed_by"]

    doomed.send(signal.SIGKILL)  # no shutdown code runs: the claim is simply left behind
    assert doomed.wait() == -signal.SIGKILL
    survivor = workers.start()

    wait_for(lambda: job_state(engine, job_id)[0] == "done", what="the job to be done")
    with engine.connect() as conn:
        row = job_row(conn, job_id)
        rescued_at = conn.execute(
            text("SELECT created_at FROM mdm.aa_job_audit "
                 "WHERE job_id = :id AND action = 'job_rescued'"),
            {"id": job_id},
        ).scalar_one()
    assert row["attempts"] == 2
    assert f"/{survivor.pid}/" in row["claimed_by"]
    assert starts(marks, job_id) == [(1, doomed.pid), (2, survivor.pid)]
    assert finished(marks) == {survivor.pid: [str(job_id)]}
    # Back to pending only once the lease had run out, with a record of whose claim it was.
    [(action, detail)] = audit_actions(engine, job_id)
    assert action == "job_rescued"
    assert detail["claimed_by"] == claimed["claimed_by"] and detail["attempts"] == 1
    assert (rescued_at - claimed["claimed_at"]).total_seconds() >= LEASE_SECS


def test_job_longer_than_lease_on_live_worker_runs_once_and_is_not_rescued(
    workers: WorkerPool, engine, tenant, marks: Path
):
    # Lease 1 s, heartbeat every 0.2 s, job 4 s; the second worker can rescue and claim.
    short_lease = {"POSTRELAY_JOB_LEASE_SECS": "1"}
    pair = [workers.start(env=short_lease), workers.start(env=short_lease)]
    wait_registered(engine, *pair)
    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {"dir": str(marks), "sleep": 4}, tenant_id=tenant)

    wait_for(lambda: job_state(engine, job_id)[0] == "done", what="the job to be done")
    with engine.connect() as conn:
        row = job_row(conn, job_id)
        leader = conn.execute(text("SELECT holder FROM mdm.aa_lease")).scalar_one()
    assert (row["completed_at"] - row["claimed_at"]).total_seconds() >= 4  # four leases
    assert row["attempts"] == 1
    assert len(starts(marks, job_id)) == 1
    assert sum(len(ids) for ids in finished(marks).values()) == 1
    assert audit_actions(engine, job_id) == []
    # The rescuer was running all along, in one of these two processes.
    assert any(f"/{p.pid}/" in leader for p in pair)


def test_concurrent_worker_processes_run_every_job_exactly_once(
    workers: WorkerPool, engine, tenant, marks: Path
):
    total = 3000
    procs = [workers.start(app=TALLY_APP, concurrency=8) for _ in range(3)]
    wait_registered(engine, *procs)
    with engine.begin() as conn:
        ids = enqueue_many(
            conn, [JobSpec("reindex", {"dir": str(marks), "i": i}, tenant) for i in range(total)]
        )

    wait_for(lambda: status_counts(engine)["done"] == total, timeout=90,
             what=f"{total} jobs to be done")
    for proc in procs:
        proc.send(signal.SIGTERM)
    assert [proc.wait() for proc in procs] == [0, 0, 0]

    ran = finished(marks, prefix="ran")
    runs = Counter(job_id for per_process in ran.values() for job_id in per_process)
    assert [job_id for job_id, n in runs.items() if n > 1] == []
    assert set(runs) == {str(i) for i in ids}
    assert set(ran) == {p.pid for p in procs}  # every process took part
    assert status_counts(engine) == Counter({"done": total})
    with engine.connect() as conn:
        assert conn.execute(
            text("SELECT max(attempts) FROM mdm.aa_job WHERE job_kind = 'reindex'")
        ).scalar_one() == 1
