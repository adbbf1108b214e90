"""Two `postrelay inbound` processes on one database, as behind two MX hosts: they share
the inbox, each message is recorded once, by one of them, and both take part."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import aiosmtplib
from sqlalchemy import text

from tests.feedback.conftest import (
    BOUNCE_DOMAIN,
    SECRET,
    await_inbox_empty,
    free_ports,
    until_listening,
)
from tests.feedback.test_inbox import bounces

POSTRELAY = Path(sys.executable).parent / "postrelay"
BACKLOG = 1500  # many batches of 100: more than either process takes in one go


async def send(port: int, verp: str, raw: bytes) -> None:
    smtp = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, timeout=10)
    await smtp.connect()
    await smtp.sendmail("", [verp], raw)
    await smtp.quit()


async def test_two_receivers_share_the_inbox_and_record_each_message_once(
        worker_env, engine, tenant, look, return_path, tmp_path):
    env = {**worker_env, "POSTRELAY_EMAIL_BOUNCE_DOMAIN": BOUNCE_DOMAIN,
           "POSTRELAY_FEEDBACK_SECRET": SECRET.decode(), "POSTRELAY_LOG_LEVEL": "INFO"}
    made = bounces(engine, tenant, return_path, BACKLOG + 2)  # (log row, VERP, DSN) each
    sent = [log for log, _, _ in made]
    mails = [(verp, raw) for _, verp, raw in made]
    ports = free_ports(2)
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    receivers = []
    for port, log in zip(ports, logs, strict=True):
        with log.open("wb") as stderr:  # a file: a pipe would fill and stop the process
            receivers.append(subprocess.Popen(
                [str(POSTRELAY), "inbound", "--host", "127.0.0.1", "--port", str(port)],
                env=env, stdout=subprocess.DEVNULL, stderr=stderr))
    try:
        await asyncio.gather(*(until_listening(port) for port in ports))
        # Messages both stored and left behind (a receiver that died before recording
        # them), then one more to each receiver, which wakes its processor at once.
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO mdm.aa_feedback_inbox (envelope_to, raw) "
                              "VALUES (:to, :raw)"),
                         [{"to": [verp], "raw": raw} for verp, raw in mails[:BACKLOG]])
        await asyncio.gather(*(send(port, *mail)
                               for port, mail in zip(ports, mails[BACKLOG:], strict=True)))
        await await_inbox_empty(engine, timeout=60)
    finally:
        for receiver in receivers:
            receiver.send_signal(signal.SIGTERM)
        codes = [receiver.wait(timeout=30) for receiver in receivers]
    assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]

    # Each receiver logs every report it records: between them, every message once.
    recorded = [log.read_text().count("postrelay.feedback.bounced") for log in logs]
    assert sum(recorded) == BACKLOG + 2 and min(recorded) > 0, recorded
    feedback = look.rows("SELECT email_log_id, kind FROM mdm.aa_email_feedback")
    assert len(feedback) == BACKLOG + 2
    assert {f["email_log_id"] for f in feedback} == {s["id"] for s in sent}
    assert {f["kind"] for f in feedback} == {"bounced"}
    assert look.rows("SELECT count(*) AS n FROM mdm.aa_email_log "
                     "WHERE delivery = 'bounced'") == [{"n": BACKLOG + 2}]
