"""Mail through a real Postfix relay and its bounces back, as a deployment that sends
through its own Postfix runs: `postrelay worker` submits each message to Postfix (Debian's,
tests/postfix.py) over STARTTLS, checking its certificate, and Postfix relays it to a
mailbox host (aiosmtpd) that refuses some recipients; Postfix bounces those to the message's
VERP address, on the bounce domain, whose MX is `postrelay inbound`, over the STARTTLS the
receiver offers. Each refused message's log row ends `bounced` and its address is
suppressed; the others were delivered with the VERP envelope sender. Nothing is faked
between the processes: Postfix writes the bounces itself."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from sqlalchemy import text

from postrelay.orchestrator.job import EmailJob, enqueue_email
from postrelay.testing import ScriptedHandler, SmtpSink, reply
from tests.acceptance.conftest import WorkerPool, wait_for
from tests.apps.mail import TEMPLATES
from tests.feedback.conftest import BOUNCE_DOMAIN, SECRET, free_ports, until_listening
from tests.postfix import Certificate, Postfix, postfix, unavailable

pytestmark = pytest.mark.acceptance

MAIL_APP = "tests.apps.mail"
REFUSED = [f"gone{i}@rejecting.example" for i in range(6)]
DELIVERED = [f"here{i}@accepting.example" for i in range(4)]
UNKNOWN_USER = "550 5.1.1 Recipient address rejected: User unknown"


@pytest.fixture
def mailbox_host() -> Iterator[SmtpSink]:
    with SmtpSink(ScriptedHandler({"*@rejecting.example": reply(UNKNOWN_USER)})) as sink:
        yield sink


@pytest.fixture
def inbound_port() -> int:
    return free_ports(1)[0]


@pytest.fixture
def certificate(ca: trustme.CA) -> Certificate:
    issued = ca.issue_cert("127.0.0.1", "localhost")
    return Certificate(issued.cert_chain_pems[0].bytes(), issued.private_key_pem.bytes())


@pytest.fixture
def relay(mailbox_host: SmtpSink, inbound_port: int,
          certificate: Certificate) -> Iterator[Postfix]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    routes = {"rejecting.example": mailbox_host.port, "accepting.example": mailbox_host.port,
              BOUNCE_DOMAIN: inbound_port}
    with postfix(routes, tls=certificate) as running:
        try:
            yield running
        finally:  # shown by pytest only when the test failed
            print(f"--- postfix.log\n{running.log()[-5000:]}")


def test_postfixs_bounces_come_back_through_postrelay_inbound(
        workers: WorkerPool, engine, tenant, relay: Postfix, mailbox_host: SmtpSink,
        inbound_port: int, certificate: Certificate, ca_file: Path, tmp_path: Path):
    (tmp_path / "cert.pem").write_bytes(certificate.cert_pem)
    (tmp_path / "key.pem").write_bytes(certificate.key_pem)
    env = {"POSTRELAY_EMAIL_BOUNCE_DOMAIN": BOUNCE_DOMAIN,
           "POSTRELAY_FEEDBACK_SECRET": SECRET.decode(),
           "POSTRELAY_SMTP_HOST": "127.0.0.1", "POSTRELAY_SMTP_PORT": str(relay.port),
           "POSTRELAY_SMTP_SECURITY": "starttls", "POSTRELAY_SMTP_CA_FILE": str(ca_file),
           "POSTRELAY_INBOUND_TLS_CERT": str(tmp_path / "cert.pem"),
           "POSTRELAY_INBOUND_TLS_KEY": str(tmp_path / "key.pem"),
           "POSTRELAY_EMAIL_TEMPLATES_DIR": str(TEMPLATES),
           "POSTRELAY_EMAIL_FROM": "Acme <noreply@acme.example>"}
    receiver = workers.start_command(
        ["inbound", "--host", "127.0.0.1", "--port", str(inbound_port)], "inbound", env=env)
    asyncio.run(until_listening(inbound_port))
    with engine.begin() as conn:
        for address in REFUSED + DELIVERED:
            enqueue_email(conn, EmailJob("welcome", to=(address,),
                                         context={"user": {"name": "Ann"}}), tenant_id=tenant)
    worker = workers.start(app=MAIL_APP, env=env)

    def outcomes() -> dict[str, tuple[str, str | None]] | None:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT to_addresses[1], status, delivery FROM mdm.aa_email_log")).all()
        found = {to: (status, delivery) for to, status, delivery in rows}
        settled = len(found) == len(REFUSED + DELIVERED) and all(
            delivery == "bounced" for to, (_, delivery) in found.items() if to in REFUSED)
        return found if settled else None

    found = wait_for(outcomes, timeout=90, what="Postfix's bounces to be recorded")
    assert found == {**{to: ("sent", "bounced") for to in REFUSED},
                     **{to: ("sent", None) for to in DELIVERED}}

    with engine.connect() as conn:
        feedback = conn.execute(text(
            "SELECT f.recipient, f.kind, f.status, f.matched_by, f.email_log_id = l.id "
            "FROM mdm.aa_email_feedback f JOIN mdm.aa_email_log l "
            "ON l.to_addresses[1] = f.recipient")).all()
        suppressed = set(conn.execute(text(
            "SELECT address FROM mdm.aa_email_suppression WHERE tenant_id = :t "
            "AND source = 'mail'"), {"t": tenant}).scalars())
        events = conn.execute(text(
            "SELECT count(*) FROM mdm.aa_outbox_event WHERE event_type = 'email.bounced'")
        ).scalar_one()
    assert sorted(feedback) == [(to, "bounced", "5.1.1", "verp", True) for to in REFUSED]
    assert suppressed == set(REFUSED)
    assert events == len(REFUSED)

    delivered = mailbox_host.handler.received
    assert sorted(to for message in delivered for to in message.recipients) == DELIVERED
    assert all(message.sender.startswith("bounce-")
               and message.sender.endswith(f"@{BOUNCE_DOMAIN}") for message in delivered)

    worker.send(signal.SIGTERM)
    assert worker.wait() == 0
    # Postfix took each message as a BDAT chunk: its smtpd counts commands at disconnect.
    wait_for(lambda: "bdat=" in relay.log(), timeout=30, what="Postfix's session summary")
    receiver.send(signal.SIGTERM)
    assert receiver.wait() == 0
    assert "ERROR" not in receiver.log()
    log = relay.log()
    assert " status=bounced " not in _lines_about(log, BOUNCE_DOMAIN)
    # Both legs encrypted: the worker's submissions, and Postfix's bounces to the receiver.
    assert "TLS connection established from localhost[127.0.0.1]" in log
    assert f"TLS connection established to 127.0.0.1[127.0.0.1]:{inbound_port}" in log


def _lines_about(log: str, domain: str) -> str:
    """Postfix's log lines about deliveries to `domain` (a bounce it could not hand over
    would say status=bounced there)."""
    return "\n".join(line for line in log.splitlines() if f"@{domain}>" in line)
