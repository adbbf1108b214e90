"""A message larger than the SIZE the server announces (RFC 1870) is not sent: the server
would refuse it after reading it all, and that 552 was logged `bounced`, the recipient's
refusal, when the message was at fault. It fails as bad input does, naming both sizes."""

from __future__ import annotations

from typing import Any

from aiosmtpd.smtp import SMTP

from postrelay.orchestrator import SmtpConfig, SmtpPool
from postrelay.orchestrator.replies import SmtpConfigError
from postrelay.testing import ScriptedHandler, SmtpSink
from tests.orchestrator.smtp_helpers import SENDER, message

LIMIT = 3000


class SmallServer(SMTP):
    """A server that takes messages of at most LIMIT bytes, and says so in its EHLO."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "data_size_limit": LIMIT})


async def test_a_message_over_the_servers_size_fails_unsent(rig, tenant):
    with SmtpSink(ScriptedHandler(), server_class=SmallServer) as small:
        await rig.pool.close()
        rig.pool = SmtpPool(SmtpConfig(host=small.host, port=small.port, timeout_secs=2.0))
        big = rig.enqueue(tenant, context={"user": {"name": "Ann " * 1000}})
        fits = rig.enqueue(tenant, to=["bob@example.com"])
        await rig.start()
        await rig.settle(big, fits)

        assert [m.recipients for m in small.handler.received] == [("bob@example.com",)]
        assert rig.job(fits)["status"] == "done"
        assert rig.job(big)["status"] == "dlq"
        [row] = rig.log(big)
        assert row["status"] == "failed" and row["smtp_code"] is None
        assert f"more than the {LIMIT} the server takes" in row["error"]
        assert rig.suppressed(tenant) == {}


async def test_the_pool_refuses_a_message_over_the_size_before_mail_from(make_pool):
    with SmtpSink(ScriptedHandler(), server_class=SmallServer) as small:
        pool = make_pool(small)
        raw = message(subject="x" * (LIMIT + 1))
        try:
            await pool.send(SENDER, ["ann@acme.example"], raw)
        except SmtpConfigError as exc:
            assert exc.stage == "mail" and exc.reply is None
            assert f"{len(raw)} bytes" in str(exc)
        else:
            raise AssertionError("sent a message over the server's SIZE")
        # The connection is still good for a message that fits.
        delivery = await pool.send(SENDER, ["ann@acme.example"], message())
        assert delivery.accepted == ("ann@acme.example",)
        assert pool.connections_opened == 1
