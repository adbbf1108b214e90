"""Every process through a real PgBouncer in transaction mode (POSTRELAY_POOLER=transaction):
workers and relays drain jobs and events with retries, a rescue and cron, each job done
exactly once; the inbound receiver records each bounce once; no prepared-statement error
anywhere; and the claim's planner and commit settings never reach another client through
the pooled server connections."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text

from postrelay.core.migrate import head_revision
from postrelay.orchestrator import ReturnPath, SmtpConfig, SmtpPool
from postrelay.queue import JobSpec, enqueue, enqueue_many
from postrelay.queue.cron import cron_create
from postrelay.relay import EventSpec, emit_many
from postrelay.testing import ScriptedHandler, SmtpSink
from tests.acceptance.conftest import (
    BOUNCER_POOL_SIZE,
    POSTRELAY,
    WorkerPool,
    job_state,
    pooled_env,
    starts,
    status_counts,
    wait_for,
    wait_registered,
)
from tests.apps.mail import TEMPLATES
from tests.feedback.conftest import BOUNCE_DOMAIN, SECRET, free_ports, until_listening
from tests.feedback.test_inbox import bounces
from tests.pgbouncer import PgBouncer

pytestmark = pytest.mark.acceptance

ANYWHERE_APP = "tests.acceptance.apps.anywhere"
SHOP_APP = "tests.apps.shop"  # order.placed → one `reindex` job
MAIL_APP = "tests.apps.mail"  # user.signed_up → a welcome email
# What a client breaking PgBouncer's rules would see (or cause) in some process's log.
POOLER_ERRORS = ("prepared statement", "unsupported startup parameter", "bind message",
                 "cannot insert multiple commands")
CLAIM_SETTINGS = {"synchronous_commit": "on", "enable_sort": "on", "enable_bitmapscan": "on",
                  "jit": "on", "plan_cache_mode": "auto"}  # the server's defaults


def done_ids(marks: Path) -> Counter[str]:
    return Counter(job_id for path in marks.glob("done.*")
                   for job_id in path.read_text().split())


def server_settings(bouncer: PgBouncer) -> list[dict[str, str]]:
    """The settings of as many pooled server connections as the pool holds: each probe
    holds its own in an open transaction, so together they see all of them."""
    probes = [psycopg.connect(bouncer.libpq) for _ in range(BOUNCER_POOL_SIZE)]
    try:
        seen = []
        for probe in probes:  # each opens a transaction and keeps its server connection
            row = {"pid": str(probe.execute("SELECT pg_backend_pid()").fetchone()[0])}
            for name in CLAIM_SETTINGS:
                row[name] = probe.execute(f"SHOW {name}").fetchone()[0]
            seen.append(row)
        return seen
    finally:
        for probe in probes:
            probe.close()


def assert_clean_logs(*logs: str) -> None:
    for log in logs:
        for error in POOLER_ERRORS:
            assert error not in log, f"{error!r} in a log:\n{log[-3000:]}"


def test_workers_relays_and_cron_drain_everything_once_through_pgbouncer(
    workers: WorkerPool, engine, tenant, marks: Path, bouncer: PgBouncer
):
    env = {**pooled_env(bouncer), "POSTRELAY_TEST_MARKS": str(marks)}
    # A worker that dies with a job in hand while it leads maintenance: the rescue (and the
    # handover of leadership) go through PgBouncer too.
    doomed = workers.start(app=ANYWHERE_APP, env=env)
    wait_registered(engine, doomed)
    with engine.begin() as conn:
        hung = enqueue(conn, "reindex", {"hang_on_attempts": [1]}, tenant_id=tenant)
    wait_for(lambda: starts(marks, hung), what="the doomed worker to start its job")
    doomed.send(signal.SIGKILL)
    assert doomed.wait() == -signal.SIGKILL

    survivors = [workers.start(app=ANYWHERE_APP, concurrency=8, env=env) for _ in range(2)]
    relays = [workers.start_command(["relay", "--app", SHOP_APP], "relay", env)
              for _ in range(2)]
    wait_registered(engine, *survivors)
    with engine.begin() as conn:
        # Every seventh job fails twice before it succeeds.
        ids = enqueue_many(conn, [
            JobSpec("reindex", {"i": i, "fail_attempts": [1, 2] if i % 7 == 0 else []}, tenant)
            for i in range(600)])
        emit_many(conn, [EventSpec("order.placed", {"n": n}, tenant, aggregate_type="order",
                                   aggregate_id=n) for n in range(400)])
        cron_create(conn, "every-second", "* * * * * *", "reindex", {}, tenant_id=tenant)

    def cron_jobs() -> int:
        with engine.connect() as conn:
            return conn.execute(text(
                "SELECT count(*) FROM mdm.aa_job WHERE status = 'done'"
                " AND created_by = 'cron:every-second'")).scalar_one()

    wait_for(lambda: job_state(engine, hung)[0] == "done", timeout=60,
             what="the dead worker's job to be rescued and done")
    wait_for(lambda: status_counts(engine)["done"] >= 1 + 600 + 400 and cron_jobs() >= 3,
             timeout=120, what="every job and event, and three cron slots, to be done")
    with engine.connect() as conn:
        conn.execute(text("DELETE FROM mdm.aa_cron_entry WHERE name = 'every-second'"))
        conn.commit()
    for proc in [*survivors, *relays]:
        proc.send(signal.SIGTERM)
    assert [proc.wait() for proc in [*survivors, *relays]] == [0, 0, 0, 0]

    with engine.connect() as conn:
        unhandled = conn.execute(text(
            "SELECT count(*) FROM mdm.aa_outbox_event WHERE handled_at IS NULL")).scalar_one()
        jobs = dict(conn.execute(text(
            "SELECT id::text, status::text FROM mdm.aa_job WHERE job_kind = 'reindex'")).all())
        retried = conn.execute(text(
            "SELECT count(*) FROM mdm.aa_job WHERE job_kind = 'reindex' AND attempts = 3"
        )).scalar_one()
    assert unhandled == 0
    assert set(jobs.values()) == {"done"}
    assert len(jobs) >= 1 + 600 + 400 + 3
    # Every job done exactly once, by a live worker.
    assert done_ids(marks) == Counter(dict.fromkeys(jobs, 1))
    assert {str(i) for i in ids} <= set(jobs)
    assert retried == len(range(0, 600, 7))
    assert starts(marks, hung) == [(1, doomed.pid), (2, starts(marks, hung)[1][1])]
    assert_clean_logs(*(proc.log() for proc in workers.procs), bouncer.log())


def test_the_claims_settings_stay_inside_its_transaction_behind_pgbouncer(
    workers: WorkerPool, engine, tenant, marks: Path, bouncer: PgBouncer
):
    env = {**pooled_env(bouncer), "POSTRELAY_TEST_MARKS": str(marks)}
    worker = workers.start(app=ANYWHERE_APP, concurrency=4, env=env)
    wait_registered(engine, worker)
    for _ in range(20):  # many small claims, spread over the pooled server connections
        with engine.begin() as conn:
            enqueue_many(conn, [JobSpec("reindex", {}, tenant) for _ in range(5)])
    wait_for(lambda: status_counts(engine)["done"] == 100, what="100 jobs to be done")
    seen = server_settings(bouncer)
    assert len({row["pid"] for row in seen}) == BOUNCER_POOL_SIZE
    assert [{k: v for k, v in row.items() if k != "pid"} for row in seen] == [
        CLAIM_SETTINGS] * BOUNCER_POOL_SIZE
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0
    assert_clean_logs(worker.log(), bouncer.log())

    # The probe sees a leak when there is one: a session SET through PgBouncer stays on
    # the server connection that ran it.
    with psycopg.connect(bouncer.libpq, autocommit=True) as careless:
        careless.execute("SET synchronous_commit = off")
        try:
            assert "off" in [row["synchronous_commit"] for row in server_settings(bouncer)]
        finally:
            careless.execute("RESET synchronous_commit")


def test_email_through_pgbouncer_sends_each_message_once(
    workers: WorkerPool, engine, tenant, bouncer: PgBouncer
):
    # The `sending` rows go through the email worker's own held connection, the outcomes
    # through the completer's: both through PgBouncer here.
    recipients = [f"user{n:03d}@example.com" for n in range(200)]
    with SmtpSink(ScriptedHandler()) as sink:
        env = {**pooled_env(bouncer), "POSTRELAY_SMTP_HOST": sink.host,
               "POSTRELAY_SMTP_PORT": str(sink.port),
               "POSTRELAY_EMAIL_TEMPLATES_DIR": str(TEMPLATES),
               "POSTRELAY_EMAIL_FROM": "Acme <noreply@acme.example>"}
        with engine.begin() as conn:
            emit_many(conn, [EventSpec("user.signed_up",
                                       {"user": {"name": f"User {n}", "email": address}},
                                       tenant_id=tenant, aggregate_type="user",
                                       aggregate_id=address)
                             for n, address in enumerate(recipients)])
        procs = [workers.start_command(["relay", "--app", MAIL_APP], "relay", env=env),
                 *(workers.start(app=MAIL_APP, concurrency=10, env=env) for _ in range(2))]
        wait_for(lambda: status_counts(engine, "email_send")["done"] == len(recipients),
                 timeout=120, what="every email job to be done")
        received = Counter(r for m in sink.handler.received for r in m.recipients)
    assert received == Counter(recipients)
    with engine.connect() as conn:
        statuses = Counter(conn.execute(text("SELECT status FROM mdm.aa_email_log")).scalars())
    assert statuses == {"sent": len(recipients)}
    for proc in procs:
        proc.send(signal.SIGTERM)
    assert [proc.wait() for proc in procs] == [0, 0, 0]
    assert_clean_logs(*(proc.log() for proc in procs), bouncer.log())
    assert [row for row in server_settings(bouncer)
            if {k: v for k, v in row.items() if k != "pid"} != CLAIM_SETTINGS] == []


async def _deliver(port: int, mails: list[tuple[str, bytes]], connections: int) -> None:
    pool = SmtpPool(SmtpConfig(host="127.0.0.1", port=port, pool_size=connections,
                               chunking=False))
    try:
        await asyncio.gather(*(pool.send("", [verp], raw) for verp, raw in mails))
    finally:
        await pool.close()


def test_bounces_through_pgbouncer_are_each_recorded_once(
    workers: WorkerPool, engine, tenant, bouncer: PgBouncer
):
    # The receiver's inbox writes (binary parameters, autocommitted, on a connection it
    # holds) and its batches (taken, read and recorded in one transaction) go through the
    # pooler, from ten SMTP connections at once.
    made = bounces(engine, tenant, ReturnPath(BOUNCE_DOMAIN, SECRET), 200)
    port = free_ports(1)[0]
    env = {**pooled_env(bouncer), "POSTRELAY_EMAIL_BOUNCE_DOMAIN": BOUNCE_DOMAIN,
           "POSTRELAY_FEEDBACK_SECRET": SECRET.decode()}
    receiver = workers.start_command(["inbound", "--host", "127.0.0.1", "--port", str(port)],
                                     "inbound", env=env)
    asyncio.run(until_listening(port))
    asyncio.run(_deliver(port, [(verp, raw) for _, verp, raw in made], connections=10))

    def recorded() -> list[str]:
        with engine.connect() as conn:
            if conn.execute(text("SELECT count(*) FROM mdm.aa_feedback_inbox")).scalar_one():
                return []
            return list(conn.execute(text(
                "SELECT email_log_id FROM mdm.aa_email_feedback")).scalars())
    found = wait_for(recorded, timeout=60, what="every bounce to be recorded")
    assert Counter(found) == Counter(sent["id"] for sent, _, _ in made)
    with engine.connect() as conn:
        delivery = Counter(conn.execute(text("SELECT delivery FROM mdm.aa_email_log")).scalars())
    assert delivery == {"bounced": len(made)}
    receiver.send(signal.SIGTERM)
    assert receiver.wait() == 0
    assert_clean_logs(receiver.log(), bouncer.log())


def test_migrate_runs_through_pgbouncer(bouncer: PgBouncer, worker_env: dict[str, str]):
    # One transaction under a transaction-scoped lock, no prepared statements: it works
    # through the pooler too (the database is at head already: a no-op run, connected).
    env = {k: v for k, v in worker_env.items() if k != "POSTRELAY_MIGRATE_DATABASE_URL"}
    result = subprocess.run([str(POSTRELAY), "migrate"], env={**env, **pooled_env(bouncer)},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"database at revision {head_revision()}\n"
    assert_clean_logs(result.stderr, bouncer.log())
