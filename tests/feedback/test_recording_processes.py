"""Feedback about the same addresses recorded at once by two `postrelay inbound` processes
(as behind two MX hosts) and by SendGrid's parallel webhook deliveries over real HTTP: each
report once, every post answered 200, no transaction lost to another, and soft bounces of
one address counted across all of them (the limit reached between them suppresses)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine

from postrelay.orchestrator import ReturnPath
from tests.feedback.conftest import Look, await_inbox_empty, bounce_mail, free_ports, insert_log
from tests.feedback.test_inbound_processes import POSTRELAY, receiver_env, send, until_listening
from tests.feedback.test_webhook_concurrency import at_once, served  # noqa: F401
from tests.feedback.test_webhook_sendgrid import URL, signed

ADDRESSES = 40
WEBHOOK_BATCHES = 4


def soft_dsn(return_path: ReturnPath, log: dict[str, Any], address: str) -> tuple[str, bytes]:
    """A Postfix DSN to the log row's VERP address: the mailbox is full (4.2.2)."""
    verp = return_path.address(log["id"])
    raw = bounce_mail("postfix_bounce.eml", verp=verp, message_id=log["message_id"],
                      recipient=address)
    return verp, raw.replace(b"5.1.1", b"4.2.2").replace(b"550", b"452")


async def deliver(port: int, mails: list[tuple[str, bytes]], connections: int = 8) -> None:
    """Every mail, in order, over `connections` at once."""
    async def connection(some: list[tuple[str, bytes]]) -> None:
        for mail in some:
            await send(port, *mail)

    await asyncio.gather(*(connection(mails[k::connections]) for k in range(connections)))


async def test_soft_bounces_from_two_receivers_and_the_webhook_at_once_add_up(
        served: str, worker_env: dict[str, str], engine: Engine,  # noqa: F811
        tenant: uuid.UUID, look: Look, return_path: ReturnPath, tmp_path: Path) -> None:
    addresses = [f"full{i}@example.com" for i in range(ADDRESSES)]
    with engine.begin() as conn:  # three messages to each address
        logs = [[insert_log(conn, tenant_id=tenant, recipients=(a,)) for _ in range(3)]
                for a in addresses]
    # The first two messages' bounces come by mail, each to both receivers (an MTA that
    # retried after a lost 250), in opposite orders; the third's in a SendGrid delivery.
    mails = [soft_dsn(return_path, sent[k], a)
             for a, sent in zip(addresses, logs, strict=True) for k in (0, 1)]
    events = [{"smtp-id": sent[2]["message_id"], "timestamp": 1700000000, "email": a,
               "event": "bounce", "type": "bounce", "status": "4.2.2",
               "reason": "452 4.2.2 mailbox full", "sg_event_id": f"full-{a}"}
              for a, sent in zip(addresses, logs, strict=True)]
    batches = [events[k::WEBHOOK_BATCHES][::(-1) ** k] for k in range(WEBHOOK_BATCHES)]

    env = receiver_env(worker_env, POSTRELAY_LOG_LEVEL="INFO")
    ports = free_ports(2)
    outs = [tmp_path / "first.log", tmp_path / "second.log"]
    receivers = []
    for port, out in zip(ports, outs, strict=True):
        with out.open("wb") as stderr:  # a file: a pipe would fill and stop the process
            receivers.append(subprocess.Popen(
                [str(POSTRELAY), "inbound", "--host", "127.0.0.1", "--port", str(port)],
                env=env, stdout=subprocess.DEVNULL, stderr=stderr))
    try:
        await asyncio.gather(*(until_listening(port) for port in ports))
        with httpx.Client(base_url=served, timeout=60) as client:
            posting = asyncio.to_thread(at_once, [
                lambda b=b: client.post(URL, **signed(b)) for b in batches])
            answers, *_ = await asyncio.gather(
                posting, deliver(ports[0], mails), deliver(ports[1], mails[::-1]))
        await await_inbox_empty(engine, timeout=60)
    finally:
        for receiver in receivers:
            receiver.send_signal(signal.SIGTERM)
        codes = [receiver.wait(timeout=30) for receiver in receivers]
    logged = [out.read_text() for out in outs]
    assert codes == [0, 0], [text[-2000:] for text in logged]
    assert [a.status_code for a in answers] == [200] * WEBHOOK_BATCHES, [a.text for a in answers]
    for text in logged:
        assert "eadlock" not in text and "conflict_retried" not in text, text[-4000:]

    feedback = look.rows("SELECT email_log_id, kind FROM mdm.aa_email_feedback")
    assert sorted(str(f["email_log_id"]) for f in feedback) == sorted(
        str(log["id"]) for sent in logs for log in sent)
    assert {f["kind"] for f in feedback} == {"soft-bounced"}
    assert set(look.suppressed(tenant)) == {(a, "") for a in addresses}
    assert len(look.events()) == 3 * ADDRESSES
    recorded = sum(text.count("postrelay.feedback.soft-bounced") for text in logged)
    assert recorded == 2 * ADDRESSES  # each DSN once, by one receiver or the other
