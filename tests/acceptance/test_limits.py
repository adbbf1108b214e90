"""Limits with four real worker processes: a rate of 50 jobs/s holds within 5 % over 20 s
and no second ever exceeds the rate plus the burst; a concurrency cap of 3 is never
exceeded; a worker SIGKILLed while holding limited jobs gives its share back after the
lease. Read from the table of start times the handlers write (apps/flow.py) and from the
claim times; nothing here depends on how fast the machine is."""

from __future__ import annotations

import signal

import pytest
from sqlalchemy import text

from postrelay.queue import JobSpec, enqueue_many, limit_set
from tests.acceptance.conftest import WorkerPool, wait_for, wait_registered
from tests.acceptance.flow_helpers import FLOW_APP, flow_runs, runs, statuses

pytestmark = pytest.mark.acceptance
__all__ = ["flow_runs"]  # the fixture, used by name

ACTOR = "ops:alice"
# The burst is a second's worth on top of the rate: workers that the machine holds up for
# less than that lose no tokens.
RATE, BURST, SPAN = 50, 50, 20.0


def enqueue_jobs(engine, tenant, n: int, sleep: float = 0.0) -> None:
    with engine.begin() as conn:
        enqueue_many(conn, [JobSpec("virus_scan", {"sleep": sleep}, tenant_id=tenant)
                            for _ in range(n)])


def start_workers(workers: WorkerPool, engine, n: int = 4, concurrency: int = 4,
                  pooler: str = "none"):
    procs = [workers.start(app=FLOW_APP, concurrency=concurrency,
                           env={"POSTRELAY_POOLER": pooler}) for _ in range(n)]
    wait_registered(engine, *procs)
    return procs


def test_a_rate_of_50_per_second_holds_across_four_workers(workers: WorkerPool, engine,
                                                           tenant, flow_runs):
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind="virus_scan", rate=f"{RATE}/s", burst=BURST)
    start_workers(workers, engine)
    enqueue_jobs(engine, tenant, int(RATE * (SPAN + 6)))
    wait_for(lambda: len(runs(engine, "virus_scan")) >= RATE * (SPAN + 3) + BURST,
             timeout=120, what="the limited jobs to run for more than 20 s")
    with engine.connect() as conn:
        # Started in 20 s from one second after the first start, once the burst is spent.
        started = conn.execute(text(
            "SELECT count(*) FROM public.flow_run, "
            "  (SELECT min(started_at) + interval '1 second' AS t0 FROM public.flow_run) f "
            "WHERE started_at >= f.t0 AND started_at < f.t0 + make_interval(secs => :span)"),
            {"span": SPAN}).scalar_one()
        # The busiest second of claims, from any claim on.
        busiest = conn.execute(text(
            "SELECT max((SELECT count(*) FROM mdm.aa_job b WHERE b.job_kind = 'virus_scan' "
            "            AND b.claimed_at >= a.claimed_at "
            "            AND b.claimed_at < a.claimed_at + interval '1 second')) "
            "FROM mdm.aa_job a WHERE a.job_kind = 'virus_scan' AND a.claimed_at IS NOT NULL"
        )).scalar_one()
        attempts = conn.execute(text(
            "SELECT max(attempts) FROM mdm.aa_job WHERE job_kind = 'virus_scan'")).scalar_one()
    per_sec = started / SPAN
    assert abs(per_sec - RATE) <= 0.05 * RATE, (started, per_sec)
    assert busiest <= RATE + BURST, busiest
    assert attempts == 1  # a throttled job is never claimed, so no attempt is spent


def max_overlap(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT max((SELECT count(*) FROM public.flow_run b "
            "            WHERE b.started_at <= a.started_at "
            "              AND coalesce(b.ended_at, 'infinity') > a.started_at)) "
            "FROM public.flow_run a")).scalar_one() or 0


# POSTRELAY_POOLER=transaction: the claim's settings are its transaction's own, no LISTEN.
@pytest.mark.parametrize("pooler", ["none", "transaction"])
def test_a_concurrency_cap_of_3_is_never_exceeded_across_four_workers(
        workers: WorkerPool, engine, tenant, flow_runs, pooler):
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind="virus_scan", concurrency=3)
    start_workers(workers, engine, pooler=pooler)
    enqueue_jobs(engine, tenant, 40, sleep=0.15)
    wait_for(lambda: statuses(engine, "virus_scan") == [("done", 1)] * 40, timeout=120,
             what="every capped job to run")
    ran = runs(engine, "virus_scan")
    assert len({r["job_id"] for r in ran}) == len(ran) == 40
    assert max_overlap(engine) == 3  # reached, never passed
    assert len({r["pid"] for r in ran}) > 1  # shared out among the workers


def test_a_killed_workers_share_of_a_cap_comes_back_after_the_lease(
        workers: WorkerPool, engine, tenant, flow_runs):
    with engine.begin() as conn:
        limit_set(conn, actor=ACTOR, kind="virus_scan", concurrency=2)
    (first,) = start_workers(workers, engine, n=1)
    enqueue_jobs(engine, tenant, 2, sleep=3600)  # held until the worker dies
    enqueue_jobs(engine, tenant, 2, sleep=0)
    wait_for(lambda: len(runs(engine, "virus_scan")) == 2, what="the cap to fill")
    first.send(signal.SIGKILL)
    first.wait()
    start_workers(workers, engine, n=1)
    # The lease (2 s here) expires, the dead worker's two jobs go back to pending, and the
    # cap lets two run again: the short ones and the rescued ones all get their turn.
    wait_for(lambda: sum(1 for s, _ in statuses(engine, "virus_scan") if s == "done") >= 2,
             timeout=60, what="the cap to come back after the lease")
    # Then the rescued ones run again (their second attempt), within the cap.
    wait_for(lambda: sum(1 for r in runs(engine, "virus_scan") if r["attempt"] == 2) == 2,
             what="the rescued jobs to run again")
    with engine.connect() as conn:
        running = conn.execute(text(
            "SELECT count(*) FROM mdm.aa_job WHERE status = 'running'")).scalar_one()
    assert running == 2
