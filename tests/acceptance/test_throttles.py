"""Shared adaptive back-off across real worker processes, a real SMTP server (aiosmtpd,
postrelay.testing) and real HTTP receivers:

- a 454 that one worker gets slows down every worker: with two workers sending under
  POSTRELAY_SMTP_RATE, neither claims an email_send job during the pause, both resume
  after it, slower than the limit alone would allow, and the throttle then ends;
- a 429 with Retry-After: 2 from one webhook endpoint holds that endpoint's deliveries
  until the pause is over, while another endpoint's deliveries go on.

Read from the database (claim times, audit rows) and from what the servers recorded; the
bounds asserted are ones a slow machine only keeps more easily."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from postrelay.queue import JobSpec, enqueue_many, throttle_list
from postrelay.testing import ScriptedHandler, SmtpSink
from tests.acceptance.conftest import WorkerPool, wait_for, wait_registered
from tests.apps.mail import TEMPLATES
from tests.webhooks.helpers import add_endpoint, emit_event
from tests.webhooks.receiver import Answer, Receiver

pytestmark = pytest.mark.acceptance

RATE = 20  # email_send jobs per second, POSTRELAY_SMTP_RATE
PAUSE_SECS = 2.0  # POSTRELAY_SMTP_THROTTLE_SECS
JOBS = 150


@pytest.fixture
def sink() -> Iterator[SmtpSink]:
    with SmtpSink(ScriptedHandler()) as running:
        yield running


def audit(engine: Engine, action: str) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(text(
            "SELECT created_at, detail FROM mdm.aa_flow_audit WHERE action = :a ORDER BY id"),
            {"a": action}).mappings()]


def claims(engine: Engine, kind: str) -> list[tuple[datetime, str]]:
    """(claimed_at, worker) of each job's last claim."""
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(  # type: ignore[misc]
            "SELECT claimed_at, claimed_by FROM mdm.aa_job WHERE job_kind::text = :k "
            "AND claimed_at IS NOT NULL ORDER BY claimed_at"), {"k": kind})]


def done(engine: Engine, kind: str) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM mdm.aa_job WHERE job_kind::text = :k "
                                 "AND status = 'done'"), {"k": kind}).scalar_one()


def test_a_454_seen_by_one_worker_slows_every_worker(workers: WorkerPool, engine, tenant,
                                                      sink):
    env = {"POSTRELAY_SMTP_HOST": sink.host, "POSTRELAY_SMTP_PORT": str(sink.port),
           "POSTRELAY_EMAIL_TEMPLATES_DIR": str(TEMPLATES),
           "POSTRELAY_EMAIL_FROM": "Acme <noreply@acme.example>",
           "POSTRELAY_SMTP_RATE": f"{RATE}/s", "POSTRELAY_SMTP_THROTTLE_SECS": str(PAUSE_SECS),
           "POSTRELAY_THROTTLE_STEP_SECS": "1"}
    procs = [workers.start(app="tests.apps.mail", concurrency=4, env=env) for _ in range(2)]
    ids = set(wait_registered(engine, *procs).values())
    with engine.begin() as conn:
        enqueue_many(conn, [JobSpec("email_send", {
            "template": "welcome", "to": [f"user{n}@example.com"],
            "context": {"user": {"name": f"User {n}"}}}, tenant_id=tenant)
            for n in range(JOBS)])
    # Both sending before the 454: on a loaded machine one worker may take the first 30
    # alone while the other's first claim is still to come.
    wait_for(lambda: len(sink.handler.received) >= 30
             and {w for _, w in claims(engine, "email_send")} == ids,
             timeout=60, what="30 messages sent, and both workers sending")
    sink.handler.refuse_next("454 4.7.0 Too many messages, slow down")
    shown = wait_for(lambda: _listed(engine), what="the throttle in the listing")
    assert shown.destination == "email_send" and "454 4.7.0" in shown.reason
    assert shown.recovers_to == RATE and 0 <= shown.rate_now <= RATE
    wait_for(lambda: done(engine, "email_send") == JOBS, timeout=120, what="every job done")
    wait_for(lambda: audit(engine, "throttle_ended"), what="the throttle to end")

    [started] = audit(engine, "throttle_started")
    start = started["created_at"]
    paused_until = datetime.fromisoformat(started["detail"]["paused_until"])
    claimed = claims(engine, "email_send")
    before = {w for at, w in claimed if at < start}
    during = [at for at, _ in claimed if start + timedelta(seconds=0.5) <= at < paused_until]
    after = {w for at, w in claimed if at >= paused_until}
    assert before == ids  # both workers were sending
    assert during == []  # neither claimed during the pause, not only the one refused
    assert after == ids  # and both went on after it
    # Half the rate, doubling each second: at most ~8 claims in the first half second after
    # the pause, where the limit alone would have let its full bucket (20) and more go.
    first = [at for at, _ in claimed if paused_until <= at < paused_until
             + timedelta(seconds=0.5)]
    assert len(first) <= 9, len(first)
    with engine.connect() as conn:
        refused = conn.execute(text(
            "SELECT j.attempts, j.status::text FROM mdm.aa_email_log l "
            "JOIN mdm.aa_job j ON j.id = l.job_id WHERE l.smtp_code = 454")).all()
    assert refused == [(2, "done")]  # the refused message was retried, as before
    assert len(sink.handler.received) == JOBS


def _listed(engine: Engine):
    with engine.connect() as conn:
        found = throttle_list(conn)
    return found[0] if found else None


def test_a_429_with_retry_after_holds_that_endpoint_while_another_goes_on(
        workers: WorkerPool, engine, tenant):
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE mdm.aa_webhook_endpoint, mdm.aa_webhook_attempt"))
    slow, fine = Receiver(), Receiver()
    for receiver in (slow, fine):
        receiver.start()
    try:
        slow_id, slow.secret = add_endpoint(engine, tenant, slow.url())
        fine_id, fine.secret = add_endpoint(engine, tenant, fine.url())
        slow.program(Answer(429, {"Retry-After": "2"}))
        events = [emit_event(engine, tenant) for _ in range(16)]
        proc = workers.start(concurrency=4,
                             env={"POSTRELAY_WEBHOOK_ALLOW_PRIVATE": "true"})
        wait_registered(engine, proc)
        _deliveries(engine, tenant, [(slow_id, events[0], None)])
        wait_for(lambda: _listed(engine), what="the endpoint's throttle")
        with engine.connect() as conn:
            [shown] = throttle_list(conn, tenant_id=tenant)
        assert shown.key == str(slow_id) and shown.reason == "HTTP 429, Retry-After 2 s"
        # The held endpoint's jobs are due once every worker has read the throttle (within
        # a second) and before the pause ends; the other endpoint's at once.
        held_at = shown.started_at + timedelta(seconds=1.5)
        free_at = shown.started_at + timedelta(seconds=0.3)
        _deliveries(engine, tenant, [(slow_id, e, held_at) for e in events[1:6]]
                    + [(fine_id, e, free_at) for e in events[6:]])
        wait_for(lambda: done(engine, "outbox_dispatch") == 16, timeout=60,
                 what="every delivery")
    finally:
        slow.stop()
        fine.stop()
    assert [r.verified for r in slow.requests] == [True] * 7  # the 429, its retry, 5 more
    assert len(fine.requests) == 10
    with engine.connect() as conn:
        claimed = conn.execute(text(
            "SELECT payload->>'endpoint_id', claimed_at FROM mdm.aa_job "
            "WHERE job_kind = 'outbox_dispatch' AND available_at > :s"),
            {"s": shown.started_at}).all()
    held = [at for endpoint, at in claimed if endpoint == str(slow_id)]
    went_on = [at for endpoint, at in claimed if endpoint == str(fine_id)]
    assert len(held) == 6 and len(went_on) == 10  # the 429's retry and 5 more; the others
    assert min(held) >= shown.paused_until  # none claimed before the pause was over
    assert max(went_on) <= min(held)  # the other endpoint's went first, unheld
    assert [a["detail"]["key"] for a in audit(engine, "throttle_started")] == [str(slow_id)]


def _deliveries(engine: Engine, tenant, jobs) -> None:
    """One outbox_dispatch job per (endpoint, event, due time)."""
    with engine.begin() as conn:
        enqueue_many(conn, [JobSpec("outbox_dispatch", {
            "channel": "webhook", "event_id": str(event), "endpoint_id": str(endpoint)},
            tenant_id=tenant, run_at=due) for endpoint, event, due in jobs])
