"""A job whose worker was SIGKILLed is pending again within the lease plus a few seconds, even
when that worker led maintenance: on a direct connection its advisory lock goes with its
connection, behind PgBouncer its row lease runs out within four rounds, and either way the
rounds follow the job lease (4 s here, against a configured interval of 30 s)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from postrelay.queue import enqueue
from tests.acceptance.conftest import (
    WorkerPool,
    audit_actions,
    job_state,
    pooled_env,
    registered,
    starts,
    wait_for,
    wait_registered,
)
from tests.factories import job_row

pytestmark = pytest.mark.acceptance

LEASE_SECS = 4.0
BOUND_SECS = LEASE_SECS + 5.0
# The old default interval: capped to a quarter of the lease, it must not delay the rescue.
SLOW_ROUNDS = {"POSTRELAY_JOB_LEASE_SECS": str(LEASE_SECS),
               "POSTRELAY_MAINTENANCE_INTERVAL_SECS": "30"}


@pytest.fixture(params=["direct", "pgbouncer"])
def mode_env(request: pytest.FixtureRequest) -> dict[str, str]:
    if request.param == "direct":
        return dict(SLOW_ROUNDS)
    bouncer = request.getfixturevalue("bouncer")
    return {**SLOW_ROUNDS, **pooled_env(bouncer)}


def lease_holder(engine) -> str | None:
    with engine.connect() as conn:
        return conn.execute(text("SELECT holder FROM mdm.aa_lease")).scalar_one_or_none()


def db_now(engine):
    with engine.connect() as conn:
        return conn.execute(text("SELECT clock_timestamp()")).scalar_one()


def test_job_of_a_sigkilled_maintenance_leader_is_rescued_within_lease_plus_five_seconds(
    workers: WorkerPool, engine, tenant, marks: Path, mode_env: dict[str, str]
):
    leader = workers.start(app="tests.acceptance.apps.steps", env=mode_env)
    leader_id = wait_registered(engine, leader)[leader.pid]
    wait_for(lambda: lease_holder(engine) == leader_id, what="the first worker to lead")
    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {"dir": str(marks), "hang_on_attempts": [1]},
                         tenant_id=tenant)
    wait_for(lambda: starts(marks, job_id), what="the leader to start the job")
    survivor = workers.start(app="tests.acceptance.apps.steps", env=mode_env)
    wait_registered(engine, survivor)
    assert lease_holder(engine) == leader_id  # the survivor is a follower

    leader.send(signal.SIGKILL)
    assert leader.wait() == -signal.SIGKILL
    killed_at = db_now(engine)

    wait_for(lambda: job_state(engine, job_id)[0] == "done", timeout=BOUND_SECS + 20,
             what="the job to be rescued and done")
    with engine.connect() as conn:
        rescued_at = conn.execute(
            text("SELECT created_at FROM mdm.aa_job_audit "
                 "WHERE job_id = :id AND action = 'job_rescued'"), {"id": job_id},
        ).scalar_one()
        row = job_row(conn, job_id)
    took = (rescued_at - killed_at).total_seconds()
    print(f"rescued {took:.2f} s after the kill")
    assert took <= BOUND_SECS, f"rescued {took:.1f} s after the kill (lease {LEASE_SECS:g} s)"
    [(action, detail)] = audit_actions(engine, job_id)
    assert action == "job_rescued" and detail["claimed_by"] == leader_id
    assert (row["attempts"], starts(marks, job_id)) == (2, [(1, leader.pid), (2, survivor.pid)])
    assert f"/{survivor.pid}/" in row["claimed_by"]
    # Leadership moved to the survivor.
    assert lease_holder(engine) == registered(engine, survivor)[survivor.pid]


def test_a_sigstopped_leader_hands_over_and_its_job_is_rescued_and_done_once(
    workers: WorkerPool, engine, tenant, marks: Path, mode_env: dict[str, str]
):
    """A leader that stops without dying keeps its connection open: the lock (or the row
    lease) must still move, its job must be rescued and done by the survivor, and once
    resumed it must not lead again beside the new leader."""
    leader = workers.start(app="tests.acceptance.apps.steps", env=mode_env)
    leader_id = wait_registered(engine, leader)[leader.pid]
    wait_for(lambda: lease_holder(engine) == leader_id, what="the first worker to lead")
    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {"dir": str(marks), "hang_on_attempts": [1]},
                         tenant_id=tenant)
    wait_for(lambda: starts(marks, job_id), what="the leader to start the job")
    survivor = workers.start(app="tests.acceptance.apps.steps", env=mode_env)
    survivor_id = wait_registered(engine, survivor)[survivor.pid]

    leader.send(signal.SIGSTOP)
    stopped_at = db_now(engine)
    try:
        wait_for(lambda: job_state(engine, job_id)[0] == "done", timeout=BOUND_SECS + 20,
                 what="the stopped leader's job to be rescued and done")
        took = (db_now(engine) - stopped_at).total_seconds()
        assert took <= BOUND_SECS, f"done {took:.1f} s after the stop"
        assert lease_holder(engine) == survivor_id
    finally:
        leader.send(signal.SIGCONT)
    time.sleep(3 * 1.0)  # a few of the resumed worker's rounds (1 s each with this lease)
    assert leader.alive
    assert lease_holder(engine) == survivor_id  # the resumed worker follows
    with engine.connect() as conn:
        row = job_row(conn, job_id)
    assert (row["state"], row["attempts"]) == ("done", 2)
    assert starts(marks, job_id) == [(1, leader.pid), (2, survivor.pid)]
    assert [a for a, _ in audit_actions(engine, job_id)] == ["job_rescued"]
