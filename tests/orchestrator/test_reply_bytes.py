"""An SMTP server's reply holding bytes that are not UTF-8 (a Latin-1 diagnostic) or a NUL:
the reply is read with `surrogateescape`, and PostgreSQL can store neither. Through a real
worker, a real aiosmtpd server and a proxy that puts such bytes into its replies, every
outcome is recorded (with U+FFFD in their place) and every job ends: before, the outcome's
batch failed at every retry (a sent message's log row never written, and every outcome
queued beside it held back), or the run's task died on its error text and left the job
`running`."""

from __future__ import annotations

import pytest

from postrelay.orchestrator import SmtpConfig, SmtpPool
from postrelay.testing import reply, reply_at_data
from tests.orchestrator.test_pipelining import RecordingProxy

NOT_TEXT = b" \xe0\x00 "  # a Latin-1 letter, then a NUL


@pytest.fixture
async def proxy(rig):
    """The rig's pool sends through a proxy that rewrites the sink's replies."""
    running = await RecordingProxy(rig.sink).start()
    await rig.pool.close()
    rig.pool = SmtpPool(SmtpConfig(host=running.host, port=running.port, pool_size=2,
                                   timeout_secs=2.0))
    yield running
    await running.stop()


async def test_an_accepting_reply_with_bytes_that_are_not_text_is_logged_sent(
        rig, proxy, tenant):
    proxy.rewrite = lambda data: data.replace(b"queued as", b"queued" + NOT_TEXT + b"as")
    jobs = [rig.enqueue(tenant, to=[f"user{n}@example.com"]) for n in range(3)]
    await rig.start()
    await rig.settle(*jobs)
    for job in jobs:
        assert rig.job(job)["status"] == "done"
        (row,) = rig.log(job)
        assert row["status"] == "sent" and "queued \ufffd\ufffd as" in row["smtp_response"]
    assert len(rig.sink.handler.received) == 3  # each sent once


@pytest.mark.parametrize(("behaviour", "status", "logged"), [
    (reply("550 5.1.1 No such user"), "dlq", ["bounced"]),
    (reply("451 4.3.0 Try again"), "dlq", ["deferred", "deferred"]),
    (reply_at_data("554 5.7.1 Rejected by policy"), "dlq", ["bounced"]),
])
async def test_a_refusal_with_bytes_that_are_not_text_ends_its_job(
        rig, proxy, tenant, behaviour, status, logged):
    rig.sink.handler.rules = [("ann@example.com", behaviour)]
    proxy.rewrite = lambda data: data.replace(b" 5.", b" 5." + NOT_TEXT).replace(
        b" 4.3.0", b" 4.3.0" + NOT_TEXT)
    job = rig.enqueue(tenant, max_attempts=2)
    await rig.start()
    await rig.settle(job)
    assert rig.job(job)["status"] == status
    assert "\ufffd\ufffd" in rig.job(job)["last_error"]
    rows = rig.log(job)
    assert [r["status"] for r in rows] == logged
    assert all("\ufffd\ufffd" in r["smtp_response"] for r in rows)
