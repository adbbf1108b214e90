"""A worker process rides out a lost database: the server restarted under it, or every one
of its connections terminated. It logs the disconnect, reconnects with backoff, and every
job, enqueued before, during or after, ends `done` — none is left `running`."""

from __future__ import annotations

import re
import signal
import threading
from datetime import datetime
from pathlib import Path
from uuid import UUID

import pytest
from sqlalchemy import Engine, make_url, text
from sqlalchemy.exc import DBAPIError

from postrelay.queue import enqueue
from tests.acceptance.conftest import (
    WorkerPool,
    finished,
    starts,
    status_counts,
    stop_server,
    wait_for,
    wait_registered,
)

pytestmark = pytest.mark.acceptance

# A long lease keeps the rescuer out of it: what these tests show is the worker writing its
# own outcomes once the database is back, each job on its first attempt.
LONG_LEASE = {"POSTRELAY_JOB_LEASE_SECS": "10"}


class Feeder(threading.Thread):
    """Enqueues a job every `every` seconds, riding out a database that comes and goes."""

    def __init__(self, engine: Engine, tenant: UUID, payload: dict, every: float = 0.1) -> None:
        super().__init__(name="feeder", daemon=True)
        self.engine, self.tenant, self.payload, self.every = engine, tenant, payload, every
        self.ids: list[UUID] = []  # the jobs whose commit succeeded
        self.failures = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.every):
            try:
                with self.engine.begin() as conn:
                    job_id = enqueue(conn, "reindex", self.payload, tenant_id=self.tenant)
            except DBAPIError:
                self.failures += 1
                continue
            self.ids.append(job_id)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=30)


def attempts_by_status(engine: Engine, ids: list[UUID]) -> dict[tuple[str, int], int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT status::text, attempts, count(*) FROM mdm.aa_job "
                 "WHERE id = ANY(:ids) GROUP BY 1, 2"),
            {"ids": ids},
        ).all()
    return {(status, attempts): n for status, attempts, n in rows}


def claim_failures(log: str) -> list[tuple[datetime, float]]:
    """(logged at, announced retry delay) of each failed claim in a worker's log."""
    return [
        (datetime.strptime(at, "%Y-%m-%d %H:%M:%S,%f"), float(delay))
        for at, delay in re.findall(
            r"^(\S+ \S+) WARNING postrelay\.worker\.claim_failed .*retry_in=([0-9.]+)$",
            log, re.MULTILINE,
        )
    ]


def test_worker_survives_database_server_restart(own_db, workers: WorkerPool, marks: Path):
    uri, server, engine, tenant = own_db
    proc = workers.start(concurrency=8, env={"POSTRELAY_DATABASE_URL": uri, **LONG_LEASE})
    wait_registered(engine, proc)
    feeder = Feeder(engine, tenant, {"dir": str(marks), "sleep": 0.5})
    feeder.start()
    try:
        wait_for(lambda: (c := status_counts(engine))["done"] >= 5 and c["running"] >= 1,
                 what="jobs to be done and running")
        stop_server(server)
        # Down until the worker has retried a few claims and a finished run failed to be
        # written: both have to wait for the database to come back.
        wait_for(lambda: len(claim_failures(proc.log())) >= 3
                 and "postrelay.completer.write_failed" in proc.log(),
                 what="the worker to notice the database is gone")
        server.ensure_postgres_running()
        back_at = len(feeder.ids)
        wait_for(lambda: len(feeder.ids) >= back_at + 15, what="jobs enqueued after the restart")
    finally:
        feeder.stop()

    wait_for(lambda: set(status_counts(engine)) == {"done"}, timeout=60,
             what="every job to be done")
    assert feeder.failures > 0  # the feeder did see the database go away
    assert attempts_by_status(engine, feeder.ids) == {("done", 1): len(feeder.ids)}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job_audit")).scalar_one() == 0
    assert "postrelay.listener.disconnected" in proc.log()
    assert proc.alive
    proc.send(signal.SIGTERM)
    assert proc.wait() == 0


def test_claim_retries_back_off_while_running_jobs_finish_in_an_outage(
    own_db, workers: WorkerPool, marks: Path
):
    uri, server, engine, tenant = own_db
    proc = workers.start(concurrency=8, env={"POSTRELAY_DATABASE_URL": uri, **LONG_LEASE})
    wait_registered(engine, proc)
    with engine.begin() as conn:  # all eight slots busy, finishing a quarter second apart
        ids = [enqueue(conn, "reindex", {"dir": str(marks), "sleep": 1 + i / 4},
                       tenant_id=tenant) for i in range(8)]
    wait_for(lambda: all(starts(marks, job_id) for job_id in ids), what="the jobs to start")
    stop_server(server)
    wait_for(lambda: len(sum(finished(marks).values(), [])) == 8,
             what="the runs to finish while the database is down")
    server.ensure_postgres_running()
    wait_for(lambda: status_counts(engine) == {"done": 8}, what="the jobs to be done")

    failures = claim_failures(proc.log())
    assert len(failures) >= 3, failures
    gaps = [((t1 - t0).total_seconds(), delay)
            for (t0, delay), (t1, _) in zip(failures, failures[1:], strict=False)]
    assert [(gap, delay) for gap, delay in gaps if gap < 0.9 * delay] == []


def test_an_outcome_waits_out_a_long_outage_and_is_written_done(
    own_db, workers: WorkerPool, marks: Path
):
    """A run that finishes while the database is down keeps its outcome, however many
    writes fail while the worker cannot connect: a failed connect is the server's state, not
    a refusal of the outcome, which five refusals would send to the DLQ without its
    effects."""
    uri, server, engine, tenant = own_db
    proc = workers.start(concurrency=2, env={"POSTRELAY_DATABASE_URL": uri, **LONG_LEASE})
    wait_registered(engine, proc)
    with engine.begin() as conn:
        job = enqueue(conn, "reindex", {"dir": str(marks), "sleep": 0.5}, tenant_id=tenant)
    wait_for(lambda: starts(marks, job), what="the job to start")
    stop_server(server)
    wait_for(lambda: str(job) in sum(finished(marks).values(), []), what="the run to finish")
    # Well past five failed writes (their backoff adds up to about 1.5 s).
    wait_for(lambda: proc.log().count("postrelay.completer.write_failed") >= 8,
             timeout=60, what="the outcome's writes to fail while the database is down")
    server.ensure_postgres_running()
    wait_for(lambda: status_counts(engine) == {"done": 1}, what="the job to be done")
    assert attempts_by_status(engine, [job]) == {("done", 1): 1}
    assert "outcome_unrecordable" not in proc.log()
    proc.send(signal.SIGTERM)
    assert proc.wait() == 0


def test_worker_carries_on_when_its_connections_are_terminated(
    workers: WorkerPool, engine, tenant, marks: Path, worker_env: dict[str, str]
):
    # Name the worker's connections, so that only they are terminated.
    app_name = "postrelay-acceptance-worker"
    url = make_url(worker_env["POSTRELAY_DATABASE_URL"]).update_query_dict(
        {"application_name": app_name}
    )
    proc = workers.start(
        concurrency=4,
        env={"POSTRELAY_DATABASE_URL": url.render_as_string(hide_password=False), **LONG_LEASE},
    )
    wait_registered(engine, proc)

    def listeners() -> set[int]:
        with engine.connect() as conn:
            return set(conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE application_name = :app "
                     "AND query = 'LISTEN postrelay_jobs'"),
                {"app": app_name},
            ).scalars())

    first_listener = wait_for(listeners, what="the worker to LISTEN")
    with engine.begin() as conn:
        before = [enqueue(conn, "reindex", {"dir": str(marks), "sleep": 0.5}, tenant_id=tenant)
                  for _ in range(6)]
    wait_for(lambda: status_counts(engine)["running"] >= 1, what="jobs to be running")

    with engine.connect() as conn:
        # The fence makes sure nothing but the worker's connections is terminated: in a
        # plain WHERE the planner may call pg_terminate_backend before the other tests.
        killed = set(conn.execute(
            text("WITH target AS MATERIALIZED ("
                 "  SELECT pid FROM pg_stat_activity WHERE application_name = :app"
                 "  AND datname = current_database() AND pid <> pg_backend_pid()) "
                 "SELECT pid FROM target WHERE pg_terminate_backend(pid)"),
            {"app": app_name},
        ).scalars())
    assert first_listener <= killed and len(killed) > len(first_listener)  # pool too

    with engine.begin() as conn:
        after = [enqueue(conn, "reindex", {"dir": str(marks)}, tenant_id=tenant)
                 for _ in range(6)]
    wait_for(lambda: status_counts(engine)["done"] == 12, what="every job to be done")
    assert attempts_by_status(engine, before + after) == {("done", 1): 12}
    new_listener = wait_for(listeners, what="the worker to LISTEN again")
    assert not new_listener & killed
    log = proc.log()
    assert "postrelay.listener.disconnected" in log
    assert proc.alive
    proc.send(signal.SIGTERM)
    assert proc.wait() == 0
