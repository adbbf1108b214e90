"""Pausing a kind with real worker processes: its jobs are not claimed while the others
are, running ones finish, and after a resume it carries on where it was, every job run
once."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from postrelay.queue import JobSpec, enqueue_many, pause, resume
from tests.acceptance.conftest import WorkerPool, wait_for, wait_registered
from tests.acceptance.flow_helpers import FLOW_APP, flow_runs, runs, statuses

pytestmark = pytest.mark.acceptance
__all__ = ["flow_runs"]  # the fixture, used by name

ACTOR = "ops:alice"


def enqueue_jobs(engine, tenant, kind: str, n: int, sleep: float = 0.0) -> None:
    with engine.begin() as conn:
        enqueue_many(conn, [JobSpec(kind, {"sleep": sleep}, tenant_id=tenant)
                            for _ in range(n)])


@pytest.mark.parametrize("pooler", ["none", "transaction"])
def test_a_paused_kind_is_not_claimed_while_others_are_and_resumes_where_it_was(
        workers: WorkerPool, engine, tenant, flow_runs, pooler):
    procs = [workers.start(app=FLOW_APP, concurrency=3, env={"POSTRELAY_POOLER": pooler})
             for _ in range(2)]
    wait_registered(engine, *procs)
    enqueue_jobs(engine, tenant, "bulk_import", 30, sleep=0.2)
    wait_for(lambda: len(runs(engine, "bulk_import")) >= 2, what="bulk_import jobs to start")

    with engine.begin() as conn:
        paused, _ = pause(conn, actor=ACTOR, kind="bulk_import")
    enqueue_jobs(engine, tenant, "reindex", 40)
    wait_for(lambda: statuses(engine, "reindex") == [("done", 1)] * 40,
             what="every reindex job to run while bulk_import is paused")
    # The runs under way when the pause came finish; nothing of bulk_import starts after
    # it but what a claim already under way took (a second, at most).
    wait_for(lambda: not any(s == "running" for s, _ in statuses(engine, "bulk_import")),
             what="the running bulk_import jobs to finish")
    started = runs(engine, "bulk_import")
    late = [r for r in started if (r["started_at"] - paused.paused_at).total_seconds() > 1.0]
    assert late == []
    assert all(r["ended_at"] is not None for r in started)
    held = statuses(engine, "bulk_import")
    assert held.count(("pending", 0)) == 30 - len(started) > 0  # attempts untouched

    with engine.begin() as conn:
        resume(conn, actor=ACTOR, kind="bulk_import")
    wait_for(lambda: statuses(engine, "bulk_import") == [("done", 1)] * 30,
             what="the paused jobs to run after the resume")
    ran = runs(engine, "bulk_import")
    assert len(ran) == 30 and len({r["job_id"] for r in ran}) == 30  # each once
    with engine.connect() as conn:
        audit = conn.execute(text(
            "SELECT action, job_kind::text, actor FROM mdm.aa_flow_audit ORDER BY id")).all()
    assert audit == [("paused", "bulk_import", ACTOR), ("resumed", "bulk_import", ACTOR)]
