"""Limited claims with real worker processes. A tenant's own limit: tenant A, limited to
one job at a time, has 3,000 jobs waiting ahead of tenant B's at a more urgent priority; B's
jobs all run while A's limit holds, and A never has two running (before, B's jobs waited
until fewer than 1,000 of A's were left). And a limited claim that fails loses nothing the
claim before it took. Counted in runs, not in seconds."""

from __future__ import annotations

import signal

import pytest
from sqlalchemy import text

from postrelay.queue import JobSpec, enqueue_many, ensure_tenant, limit_set
from tests.acceptance.conftest import WorkerPool, wait_for, wait_registered
from tests.acceptance.flow_helpers import FLOW_APP, flow_runs, runs

pytestmark = pytest.mark.acceptance
__all__ = ["flow_runs"]  # the fixture, used by name

BACKLOG = 3_000


def most_running_at_once(engine, tenant) -> int:
    """Of the tenant's runs, the most that overlapped (each start against the runs then
    under way, an unfinished one as under way still)."""
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT COALESCE(max((SELECT count(*) FROM public.flow_run b "
            "    WHERE b.tenant_id = a.tenant_id AND b.started_at <= a.started_at "
            "      AND (b.ended_at IS NULL OR b.ended_at > a.started_at))), 0) "
            "FROM public.flow_run a WHERE a.tenant_id = :t"), {"t": tenant}).scalar_one()


def test_a_tenants_own_limit_holds_back_only_its_own_jobs(workers: WorkerPool, engine,
                                                          tenant, flow_runs):
    a = tenant
    with engine.begin() as conn:
        b = ensure_tenant(conn, "globex")
        limit_set(conn, actor="api:key:acme", kind="virus_scan", tenant_id=a, concurrency=1)
        conn.execute(text(
            "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, priority, available_at) "
            "SELECT :t, 'virus_scan', '{\"sleep\": 0.05}', 10, "
            "       now() - interval '1 hour' + g * interval '1 ms' "
            "FROM generate_series(1, :n) AS g"), {"t": a, "n": BACKLOG})
        enqueue_many(conn, [JobSpec("virus_scan", {}, tenant_id=b) for _ in range(20)])
    procs = [workers.start(app=FLOW_APP, concurrency=4) for _ in range(2)]
    wait_registered(engine, *procs)
    wait_for(lambda: sum(r["tenant_id"] == b and r["ended_at"] is not None
                         for r in runs(engine, "virus_scan")) == 20,
             timeout=60, what="B's 20 jobs to run beside A's limited backlog")
    a_runs = sum(r["tenant_id"] == a for r in runs(engine, "virus_scan"))
    assert a_runs < BACKLOG - 1_000  # B did not wait for A's backlog to shrink
    assert most_running_at_once(engine, a) == 1


def test_jobs_of_a_committed_claim_run_when_the_limited_claim_after_it_fails(
        workers: WorkerPool, engine, tenant, flow_runs):
    """A claim takes the unlimited kinds, commits, then claims the limited ones in a
    transaction of its own. When that second one fails (here its connection is cut while it
    waits for the limits' lock), the first one's jobs are the worker's all the same: they
    run at once, instead of staying `running`, unrun, until a heartbeat hands them back as
    a lost claim's."""
    with engine.begin() as conn:
        limit_set(conn, actor="ops:alice", kind="virus_scan", concurrency=5)
        job = enqueue_many(conn, [JobSpec("reindex", {}, tenant_id=tenant)])[0]
    with engine.connect() as holder:
        holder.execute(text("SELECT id FROM mdm.aa_job_limit FOR UPDATE"))
        me = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()
        proc = workers.start(app=FLOW_APP, concurrency=4)
        wait_registered(engine, proc)

        def waiting_claim() -> int | None:
            with engine.connect() as conn:
                return conn.execute(text(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE '%aa_job_limit%FOR UPDATE%' AND pid <> :me"),
                    {"me": me}).scalar()

        pid = wait_for(waiting_claim, what="the limited claim to wait for the limits' lock")
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        holder.rollback()
    wait_for(lambda: any(r["job_id"] == job and r["ended_at"] for r in runs(engine)),
             timeout=10, what="the plain claim's job to run")
    with engine.connect() as conn:
        status = conn.execute(text("SELECT status::text, attempts FROM mdm.aa_job "
                                   "WHERE id = :id"), {"id": job}).one()
        rescues = conn.execute(text("SELECT count(*) FROM mdm.aa_job_audit WHERE job_id = :id "
                                    "AND action = 'job_rescued'"), {"id": job}).scalar_one()
    assert tuple(status) in {("running", 1), ("done", 1)}
    # Not taken back from the worker as a claim it had lost: an email's attempt would then
    # be logged `unknown` though it never began.
    assert rescues == 0 and "orphans_released" not in proc.log()
    assert "postrelay.worker.claim_failed" in proc.log()


def test_a_claim_in_flight_when_the_worker_stops_is_handed_back_uncounted(
        workers: WorkerPool, engine, tenant, flow_runs):
    """SIGTERM while a claim waits (its limited part, for the limits' lock): the stop lets
    the claim finish and hands back what it took, the attempt not counted, instead of
    cancelling it and leaving what it had committed `running` under a gone worker until
    the lease ran out."""
    with engine.begin() as conn:
        limit_set(conn, actor="ops:alice", kind="virus_scan", concurrency=5)
        job = enqueue_many(conn, [JobSpec("reindex", {}, tenant_id=tenant)])[0]
    with engine.connect() as holder:
        holder.execute(text("SELECT id FROM mdm.aa_job_limit FOR UPDATE"))
        proc = workers.start(app=FLOW_APP, concurrency=4)
        wait_registered(engine, proc)
        wait_for(lambda: job_row(engine, job) == ("running", 1),
                 what="the claim to take the job and wait for the limits' lock")
        proc.send(signal.SIGTERM)
        wait_for(lambda: "postrelay.worker.stopping" in proc.log(), what="the stop to begin")
        holder.rollback()
    assert proc.wait() == 0
    assert job_row(engine, job) == ("pending", 0)
    assert runs(engine) == []


def job_row(engine, job) -> tuple[str, int]:
    with engine.connect() as conn:
        return tuple(conn.execute(text("SELECT status::text, attempts FROM mdm.aa_job "
                                       "WHERE id = :id"), {"id": job}).one())
