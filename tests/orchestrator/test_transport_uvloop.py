"""The SMTP pool on the loop `postrelay worker` runs on (core/eventloop.py: uvloop's where it
is installed). aiosmtplib opens each connection (EHLO, STARTTLS, AUTH) and the dialogue
then takes its transport over; that hand-over must hold on uvloop's TLS transport as on
asyncio's. A plain test, not a coroutine: it runs its own loop, as the command does."""

from __future__ import annotations

import asyncio

from pydantic import SecretStr

from postrelay.core.eventloop import run
from postrelay.orchestrator.transport import SmtpConfig, SmtpPool
from tests.orchestrator.smtp_helpers import SENDER, message

ANN = "ann@acme.example"


def test_the_worker_loop_sends_over_starttls_and_auth_on_one_connection(
        make_sink, server_tls, ca_file):
    sink = make_sink(tls_context=server_tls, auth={"mailer": "s3cret"})
    config = SmtpConfig(host=sink.host, port=sink.port, pool_size=1, timeout_secs=5.0,
                        security="starttls", ca_file=ca_file, username="mailer",
                        password=SecretStr("s3cret"))

    async def send_three() -> tuple[str, int]:
        pool = SmtpPool(config)
        try:
            for _ in range(3):
                await pool.send(SENDER, [ANN], message())
            return type(asyncio.get_running_loop()).__module__, pool.connections_opened
        finally:
            await pool.close()

    loop_module, opened = run(send_three())

    assert loop_module.startswith("uvloop")
    assert opened == 1
    received = sink.handler.received
    assert len(received) == 3
    assert all(r.tls and r.login == "mailer" for r in received)
