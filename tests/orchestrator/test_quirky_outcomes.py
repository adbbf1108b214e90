"""What the `email_send` handler records against real aiosmtpd servers that misbehave
(smtp_helpers.quirky), through a real worker and database: each attempt's log row says
`sent`, `deferred`, `failed` or `unknown` by the rules of docs/state_machine.md, and every
job ends (done, or in the DLQ), none left running."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from postrelay.orchestrator import SmtpConfig, SmtpPool
from postrelay.testing import ScriptedHandler, SmtpSink
from tests.orchestrator.smtp_helpers import HANG, Script, quirky

LONG_ID = secrets.token_hex(3000).encode()  # random: no index entry compresses it


@pytest.fixture
def script() -> Script:
    return Script()


@pytest.fixture
def sink(script: Script) -> Iterator[SmtpSink]:
    """The rig's server (conftest.py), following `script`."""
    with SmtpSink(ScriptedHandler(), server_class=quirky(script)) as running:
        yield running


@pytest.mark.parametrize(("replies", "close_after", "template", "logged", "job", "taken"), [
    # Any 2xx to the message is its acceptance: sent once, never again.
    ({"END": b"251 2.1.5 Forwarded"}, set(), "welcome", ["sent"], "done", 1),
    ({"END": b"200"}, set(), "welcome", ["sent"], "done", 1),
    # No verdict on a message the server has: unknown, and the template holds it.
    ({"END": b"354 What now?"}, set(), "invoice", ["unknown"], "dlq", 1),
    ({"END": b"250-2.0.0 Ok\r\n554 5.7.1 Rejected"}, set(), "invoice", ["unknown"], "dlq", 1),
    ({"END": HANG}, set(), "invoice", ["unknown"], "dlq", 1),
    # Nothing went: deferred, and retried.
    ({}, {"MAIL"}, "welcome", ["deferred", "deferred"], "dlq", 0),
    ({"RCPT": b"421 4.3.2 Shutting down"}, {"RCPT"}, "welcome", ["deferred", "deferred"],
     "dlq", 0),
    ({"MAIL": b"354 Go ahead"}, set(), "welcome", ["deferred", "deferred"], "dlq", 0),
    # Accepted with a reply long beyond RFC 5321's 512 octets, or not ASCII.
    ({"END": b"250 2.0.0 Ok: queued as " + LONG_ID}, set(), "welcome", ["sent"], "done", 1),
    ({"END": "250 2.0.0 Übernommen".encode("latin-1")}, set(), "welcome", ["sent"], "done",
     1),
    # A server that does not know EHLO.
    ({"EHLO": b"502 5.5.1 Command not implemented"}, set(), "welcome", ["sent"], "done", 1),
], ids=["251", "200", "354", "disagreeing-lines", "silent", "closed-after-mail",
        "421-and-close", "354-to-mail", "long", "latin-1", "helo-only"])
async def test_a_misbehaving_server_gets_each_attempt_its_recorded_outcome(
        rig, tenant, sink, script, replies, close_after, template, logged, job, taken):
    script.replies.update(replies)
    script.close_after.update(close_after)
    job_id = rig.enqueue(tenant, template=template, max_attempts=2)
    await rig.start()
    await rig.settle(job_id)

    assert rig.job(job_id)["status"] == job
    rows = rig.log(job_id)
    assert [r["status"] for r in rows] == logged
    assert len(sink.handler.received) == taken
    if logged == ["sent"] and "END" in replies:  # the reply is recorded as it came
        assert rows[0]["smtp_code"] == int(replies["END"][:3])
        assert rows[0]["queue_id"] is None  # none of a known form, or none that long
    if template == "invoice":
        assert "held for an operator" in rig.job(job_id)["last_error"]


async def test_starttls_required_of_a_helo_only_server_fails_the_job_unsent(
        rig, tenant, sink, script, ca_file):
    """A configuration the server cannot meet: `failed` (not attempted), never `bounced`
    (the bounce rate would count every message), and the job is in the DLQ for a retry
    once the settings or the server are fixed."""
    script.replies["EHLO"] = b"502 5.5.1 Command not implemented"
    await rig.pool.close()
    rig.pool = SmtpPool(SmtpConfig(host=sink.host, port=sink.port, security="starttls",
                                   ca_file=ca_file, timeout_secs=2.0))
    job_id = rig.enqueue(tenant, max_attempts=3)
    await rig.start()
    await rig.settle(job_id)

    assert rig.job(job_id)["status"] == "dlq"
    [row] = rig.log(job_id)
    assert row["status"] == "failed" and row["smtp_code"] == 502
    assert "STARTTLS" in row["error"] and "502 5.5.1 Command not implemented" in row["error"]
    assert "MAIL" not in script.commands and sink.handler.received == []
