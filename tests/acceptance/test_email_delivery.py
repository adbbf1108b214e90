"""Email end to end across real processes: `postrelay relay` and `postrelay worker` against
a real PostgreSQL and a real SMTP server (aiosmtpd, in this test process).

- 1,000 events through one relay and four workers: every recipient gets exactly one
  message, counted at the server.
- A worker SIGKILLed after the server accepted the message (its 250 sent) and before the
  outcome reached the database: the rescuer takes the job back, the next attempt records the lost
  attempt `unknown` under the id that attempt gave its row, and the template's policy
  decides — resend by default, hold in the DLQ for invoices.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from uuid import UUID

import pytest
from sqlalchemy import Engine, text

from postrelay.orchestrator.attempts import attempt_log_id
from postrelay.queue.admin import dlq_retry
from postrelay.relay import EventSpec, emit, emit_many
from postrelay.testing import ScriptedHandler, SmtpSink
from tests.acceptance.conftest import WorkerPool, wait_for
from tests.apps.mail import TEMPLATES

pytestmark = pytest.mark.acceptance

MAIL_APP = "tests.apps.mail"


class StopsTheSenderAtData(ScriptedHandler):
    """ScriptedHandler that, with `stop_at_data` set to a process id, stops that process
    (SIGSTOP) once a message is stored, before the server's 250 goes out."""

    stop_at_data: int | None = None

    async def handle_DATA(self, server, session, envelope) -> str:  # noqa: N802
        reply = await super().handle_DATA(server, session, envelope)
        if self.stop_at_data is not None:
            os.kill(self.stop_at_data, signal.SIGSTOP)
        return reply


@pytest.fixture
def sink() -> Iterator[SmtpSink]:
    with SmtpSink(StopsTheSenderAtData()) as running:
        yield running


@pytest.fixture
def mail_env(sink: SmtpSink) -> dict[str, str]:
    return {
        "POSTRELAY_SMTP_HOST": sink.host, "POSTRELAY_SMTP_PORT": str(sink.port),
        "POSTRELAY_EMAIL_TEMPLATES_DIR": str(TEMPLATES),
        "POSTRELAY_EMAIL_FROM": "Acme <noreply@acme.example>",
    }


def email_statuses(engine: Engine, job_id: UUID | None = None) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(text(
            "SELECT status FROM mdm.aa_email_log WHERE CAST(:job AS uuid) IS NULL "
            "OR job_id = CAST(:job AS uuid) ORDER BY attempt, created_at"),
            {"job": str(job_id) if job_id else None}).scalars())


def email_jobs(engine: Engine) -> Counter[str]:
    with engine.connect() as conn:
        return Counter(dict(conn.execute(text(
            "SELECT status::text, count(*) FROM mdm.aa_job WHERE job_kind = 'email_send' "
            "GROUP BY 1")).all()))


def test_a_thousand_events_through_a_relay_and_four_workers_send_each_message_once(
    workers: WorkerPool, engine, tenant, sink, mail_env
):
    recipients = [f"user{n:04d}@example.com" for n in range(1000)]
    with engine.begin() as conn:
        emit_many(conn, [EventSpec("user.signed_up", {"user": {"name": f"User {n}",
                                                                "email": address}},
                                   tenant_id=tenant, aggregate_type="user",
                                   aggregate_id=address)
                         for n, address in enumerate(recipients)])
    workers.start_command(["relay", "--app", MAIL_APP], "relay", env=mail_env)
    for _ in range(4):
        workers.start(app=MAIL_APP, concurrency=10, env=mail_env)
    wait_for(lambda: email_jobs(engine)["done"] == 1000, timeout=120,
             what="1,000 email jobs to be done")
    received = Counter(r for m in sink.handler.received for r in m.recipients)
    assert received == Counter(recipients)  # exactly one message each, nothing else
    assert Counter(email_statuses(engine)) == {"sent": 1000}
    with engine.connect() as conn:
        message_ids = conn.execute(text(
            "SELECT count(DISTINCT message_id) FROM mdm.aa_email_log")).scalar_one()
    assert message_ids == 1000


def kill_between_accept_and_commit(
    workers: WorkerPool, engine: Engine, sink: SmtpSink, mail_env: dict[str, str],
    job_id: UUID, address: str,
) -> datetime:
    """Run the job in a worker that is SIGKILLed after the server accepted the message and
    before the outcome reaches the database: the sink stops the worker (SIGSTOP) as it
    stores the message, so the 250 goes out to a process that never reads it. (An outcome
    already sent is committed by the server whether its worker lives or not: the outcome
    and its log row go in one round trip.) Returns the lost claim's moment."""
    doomed = workers.start(app=MAIL_APP, concurrency=1, env=mail_env)
    sink.handler.stop_at_data = doomed.pid
    try:
        wait_for(lambda: sink.handler.count_for(address) == 1, what="the server to accept")
        doomed.send(signal.SIGKILL)
        assert doomed.wait() == -signal.SIGKILL
    finally:
        sink.handler.stop_at_data = None
    # The outcome died with the worker: the claim is all that says the message may have left.
    assert email_statuses(engine, job_id) == []
    with engine.connect() as conn:
        return conn.execute(text("SELECT claimed_at FROM mdm.aa_job WHERE id = :id"),
                            {"id": job_id}).scalar_one()


def _status(engine: Engine, job_id: UUID) -> str:
    with engine.connect() as conn:
        return conn.execute(text("SELECT status::text FROM mdm.aa_job WHERE id = :id"),
                            {"id": job_id}).scalar_one()


def emit_one(engine: Engine, tenant: UUID, event_type: str, payload: dict) -> None:
    with engine.begin() as conn:
        emit(conn, event_type, payload, tenant_id=tenant, aggregate_type="test",
             aggregate_id="1")


def only_email_job(engine: Engine) -> UUID:
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT id FROM mdm.aa_job WHERE job_kind = 'email_send'")).scalar_one()


def test_a_message_whose_outcome_was_lost_is_resent_by_default(
    workers: WorkerPool, engine, tenant, sink, mail_env
):
    address = "ann@example.com"
    emit_one(engine, tenant, "user.signed_up", {"user": {"name": "Ann", "email": address}})
    workers.start_command(["relay", "--app", MAIL_APP], "relay", env=mail_env)
    wait_for(lambda: email_jobs(engine), what="the relay to make the job")
    job_id = only_email_job(engine)
    claimed_at = kill_between_accept_and_commit(workers, engine, sink, mail_env, job_id,
                                                address)

    workers.start(app=MAIL_APP, env=mail_env)  # rescues the job once its lease is over
    wait_for(lambda: _status(engine, job_id) == "done", what="the job to be resent")
    assert email_statuses(engine, job_id) == ["unknown", "sent"]
    with engine.connect() as conn:  # under the id the lost attempt's VERP address carried
        unknown = conn.execute(text("SELECT id FROM mdm.aa_email_log WHERE job_id = :j "
                                    "AND status = 'unknown'"), {"j": job_id}).scalar_one()
    assert unknown == attempt_log_id(job_id, claimed_at)
    assert sink.handler.count_for(address) == 2  # at least once: the policy chose to resend
    messages = {m.message["Message-ID"] for m in sink.handler.received}
    assert messages == {f"<{job_id}@acme.example>"}  # one Message-ID: receivers can dedupe


def test_a_message_whose_outcome_was_lost_is_held_when_its_template_says_so(
    workers: WorkerPool, engine, tenant, sink, mail_env
):
    address = "billing@example.com"
    emit_one(engine, tenant, "invoice.issued", {"invoice": "I-7",
                                                "customer": {"email": address}})
    workers.start_command(["relay", "--app", MAIL_APP], "relay", env=mail_env)
    wait_for(lambda: email_jobs(engine), what="the relay to make the job")
    job_id = only_email_job(engine)
    kill_between_accept_and_commit(workers, engine, sink, mail_env, job_id, address)

    workers.start(app=MAIL_APP, env=mail_env)
    wait_for(lambda: _status(engine, job_id) == "dlq", what="the job to be held")
    assert email_statuses(engine, job_id) == ["unknown"]
    assert sink.handler.count_for(address) == 1  # not resent
    with engine.connect() as conn:
        error = conn.execute(text("SELECT last_error FROM mdm.aa_job WHERE id = :id"),
                             {"id": job_id}).scalar_one()
    assert "held for an operator" in error

    # The operator decides to send it again.
    with engine.begin() as conn:
        dlq_retry(conn, job_id, actor="operator")
    wait_for(lambda: _status(engine, job_id) == "done", what="the retried job to send")
    assert email_statuses(engine, job_id) == ["unknown", "sent"]
    assert sink.handler.count_for(address) == 2
