"""Fair claiming with a real worker process: tenant B's one job, enqueued behind a backlog
of 20,000 of tenant A's, starts in the worker's next claim when claims are fair, and waits
behind A's backlog when they are not. Counted in claims (A's jobs that start between B's
enqueue and B's start), not in seconds."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from postrelay.queue import enqueue, ensure_tenant
from tests.acceptance.conftest import WorkerPool, wait_for, wait_registered
from tests.acceptance.flow_helpers import FLOW_APP, flow_runs

pytestmark = pytest.mark.acceptance
__all__ = ["flow_runs"]  # the fixture, used by name

CONCURRENCY = 4
BACKLOG = 20_000


def started_after(engine, tenant, since) -> int:
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT count(*) FROM public.flow_run WHERE tenant_id = :t AND started_at > :s"),
            {"t": tenant, "s": since}).scalar_one()


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "unfair"])
def test_b_behind_a_backlog_starts_in_the_next_claim_only_when_fair(
        workers: WorkerPool, engine, tenant, flow_runs, fair):
    a = tenant
    with engine.begin() as conn:
        b = ensure_tenant(conn, "globex")
        conn.execute(text(
            "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, available_at) "
            "SELECT :t, 'reindex', '{}', now() - interval '1 hour' + g * interval '1 ms' "
            "FROM generate_series(1, :n) AS g"), {"t": a, "n": BACKLOG})
    # Claims for free slots only, so that one claim is at most CONCURRENCY jobs.
    proc = workers.start(app=FLOW_APP, concurrency=CONCURRENCY, env={
        "POSTRELAY_FAIR_CLAIMING": "true" if fair else "false",
        "POSTRELAY_WORKER_CLAIM_AHEAD_SECS": "0"})
    wait_registered(engine, proc)
    wait_for(lambda: started_after(engine, a, "-infinity") >= 50, what="A's backlog draining")

    with engine.begin() as conn:
        job = enqueue(conn, "reindex", {}, tenant_id=b)
        enqueued = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
    if fair:
        wait_for(lambda: started_after(engine, b, "-infinity") == 1, what="B's job to start")
        with engine.connect() as conn:
            b_started = conn.execute(text(
                "SELECT started_at FROM public.flow_run WHERE job_id = :j"),
                {"j": job}).scalar_one()
            a_between = conn.execute(text(
                "SELECT count(*) FROM public.flow_run "
                "WHERE tenant_id = :a AND started_at > :s AND started_at < :e"),
                {"a": a, "s": enqueued, "e": b_started}).scalar_one()
        # At most the claim under way when B's job arrived, and A's share of the next.
        assert a_between <= 2 * CONCURRENCY
    else:
        wait_for(lambda: started_after(engine, a, enqueued) >= 50 * CONCURRENCY,
                 what="more of A's backlog to start")
        with engine.connect() as conn:
            status = conn.execute(text("SELECT status::text FROM mdm.aa_job WHERE id = :j"),
                                  {"j": job}).scalar_one()
        assert status == "pending"
        assert started_after(engine, b, "-infinity") == 0
