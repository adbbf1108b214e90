"""SmtpPool against a real aiosmtpd server on loopback: reuse, TLS modes, AUTH and its pause,
per-recipient refusals, failures during DATA, throttling and reconnection."""

from __future__ import annotations

import asyncio
import functools
import logging
import socket

import pytest
from pydantic import SecretStr

from postrelay.core.errors import PostrelayError
from postrelay.orchestrator.transport import (
    Reply,
    SendProgress,
    SmtpAnswerLost,
    SmtpAuthFailed,
    SmtpConfig,
    SmtpPaused,
    SmtpPermanent,
    SmtpThrottled,
    SmtpTransient,
)
from postrelay.testing import drop_after_data, reply, reply_at_data, slow
from tests.orchestrator.smtp_helpers import SENDER, FakeClock, eventually, message

ANN = "ann@acme.example"
BOB = "bob@acme.example"


@pytest.fixture(params=[True, False], ids=["pipelining", "no-pipelining"])
def make_sink(request, make_sink):
    """Every test here against a server that offers PIPELINING and one that does not."""
    return functools.partial(make_sink, pipelining=request.param)


async def test_sequential_sends_reuse_one_connection(make_sink, make_pool):
    sink = make_sink()
    pool = make_pool(sink, pool_size=1)

    deliveries = [await pool.send(SENDER, [ANN], message(subject=f"n{n}")) for n in range(10)]

    assert sink.connections == 1 and pool.connections_opened == 1
    assert pool.messages_sent == 10
    received = sink.handler.received
    assert [r.message["Subject"] for r in received] == [f"n{n}" for n in range(10)]
    assert [d.queue_id for d in deliveries] == [r.queue_id for r in received]
    assert deliveries[0].accepted == (ANN,) and deliveries[0].refused == {}
    assert deliveries[0].reply.code == 250 and deliveries[0].reply.enhanced == "2.0.0"


async def test_concurrent_sends_stay_within_pool_size(make_sink, make_pool):
    # A slow RCPT keeps sends overlapping, so the pool has to open more than one connection.
    sink = make_sink({"*": slow(0.05)})
    pool = make_pool(sink, pool_size=4)

    await asyncio.gather(*(pool.send(SENDER, [f"u{n}@acme.example"], message()) for n in
                           range(20)))

    assert len(sink.handler.received) == 20
    assert 1 < sink.connections <= 4
    assert pool.connections_opened == sink.connections


async def test_starttls(make_sink, make_pool, server_tls, ca_file):
    sink = make_sink(tls_context=server_tls, require_starttls=True)
    pool = make_pool(sink, security="starttls", ca_file=ca_file)

    await pool.send(SENDER, [ANN], message())

    assert sink.handler.received[0].tls


async def test_implicit_tls(make_sink, make_pool, server_tls, ca_file):
    sink = make_sink(ssl_context=server_tls)
    pool = make_pool(sink, security="tls", ca_file=ca_file)

    await pool.send(SENDER, [ANN], message())
    await pool.send(SENDER, [ANN], message())

    assert [r.tls for r in sink.handler.received] == [True, True]
    assert sink.connections == 1


async def test_untrusted_certificate_fails_at_tls_unless_validation_is_off(
    make_sink, make_pool, server_tls
):
    sink = make_sink(ssl_context=server_tls)

    with pytest.raises(SmtpTransient) as caught:
        await make_pool(sink, security="tls").send(SENDER, [ANN], message())
    assert caught.value.stage == "tls"

    await make_pool(sink, security="tls", validate_certs=False).send(SENDER, [ANN], message())
    assert len(sink.handler.received) == 1


async def test_starttls_required_but_not_offered(make_sink, make_pool):
    sink = make_sink()  # no TLS context: the server does not offer STARTTLS
    pool = make_pool(sink, security="starttls")

    with pytest.raises(SmtpTransient) as caught:
        await pool.send(SENDER, [ANN], message())

    assert caught.value.stage == "tls"
    assert "STARTTLS" in str(caught.value)
    assert sink.handler.received == []
    assert pool.connections_opened == 0


async def test_auth_success(make_sink, make_pool, server_tls, ca_file):
    sink = make_sink(tls_context=server_tls, auth={"mailer": "s3cret"})
    pool = make_pool(sink, security="starttls", ca_file=ca_file, username="mailer",
                     password=SecretStr("s3cret"))

    await pool.send(SENDER, [ANN], message())

    assert sink.handler.received[0].login == "mailer"


async def test_auth_failure_pauses_sending_then_recovers(
    make_sink, make_pool, server_tls, ca_file
):
    sink = make_sink(tls_context=server_tls, auth={"mailer": "rotated"})
    clock = FakeClock()
    pool = make_pool(sink, clock=clock, security="starttls", ca_file=ca_file,
                     username="mailer", password=SecretStr("stale"), auth_pause_secs=30.0)

    with pytest.raises(SmtpAuthFailed) as failed:
        await pool.send(SENDER, [ANN], message())
    assert failed.value.stage == "auth" and failed.value.reply.code == 535

    # Paused: refused at once, without another connection to the server.
    with pytest.raises(SmtpPaused) as paused:
        await pool.send(SENDER, [ANN], message())
    assert paused.value.remaining_secs == pytest.approx(30.0)
    assert isinstance(paused.value, SmtpTransient)
    clock.advance(29.0)
    assert pool.paused_for() == pytest.approx(1.0)
    with pytest.raises(SmtpPaused):
        await pool.send(SENDER, [ANN], message())
    assert sink.connections == 1

    sink.credentials["mailer"] = "stale"  # the server now accepts the pool's credentials
    clock.advance(1.0)
    assert pool.paused_for() == 0.0
    await pool.send(SENDER, [ANN], message())
    assert sink.handler.received[0].login == "mailer"


async def test_4xx_at_rcpt_is_transient_with_refusals(make_sink, make_pool):
    sink = make_sink({"busy@*": reply("450 4.2.0 Mailbox busy")})
    pool = make_pool(sink)

    with pytest.raises(SmtpTransient) as caught:
        await pool.send(SENDER, ["busy@acme.example"], message())

    error = caught.value
    assert not isinstance(error, SmtpThrottled)
    assert error.stage == "rcpt"
    assert error.refused == {"busy@acme.example": Reply(450, "4.2.0", "Mailbox busy")}
    # The server replied, so the connection was reset and is reused.
    await pool.send(SENDER, [ANN], message())
    assert sink.connections == 1


async def test_unknown_user_is_permanent(make_sink, make_pool):
    sink = make_sink({"nobody@*": reply("550 5.1.1 No such user")})
    pool = make_pool(sink)

    with pytest.raises(SmtpPermanent) as caught:
        await pool.send(SENDER, ["nobody@acme.example"], message())

    assert caught.value.stage == "rcpt"
    assert caught.value.reply == Reply(550, "5.1.1", "No such user")
    assert caught.value.refused["nobody@acme.example"].enhanced == "5.1.1"


async def test_all_refused_with_one_temporary_is_transient(make_sink, make_pool):
    sink = make_sink({"nobody@*": reply("550 5.1.1 No such user"),
                      "busy@*": reply("450 4.2.0 Mailbox busy")})
    pool = make_pool(sink)

    with pytest.raises(SmtpTransient) as caught:
        await pool.send(SENDER, ["nobody@acme.example", "busy@acme.example"], message())

    assert set(caught.value.refused) == {"nobody@acme.example", "busy@acme.example"}


async def test_partial_refusal_delivers_to_the_accepted(make_sink, make_pool):
    sink = make_sink({"nobody@*": reply("550 5.1.1 No such user")})
    pool = make_pool(sink)

    delivery = await pool.send(SENDER, [ANN, "nobody@acme.example", BOB], message())

    assert delivery.accepted == (ANN, BOB)
    assert delivery.refused == {"nobody@acme.example": Reply(550, "5.1.1", "No such user")}
    assert sink.handler.received[0].recipients == (ANN, BOB)


async def test_5xx_at_data_is_permanent(make_sink, make_pool):
    sink = make_sink({"*@blocked.example": reply_at_data("554 5.7.1 Blocked by policy")})
    pool = make_pool(sink)

    with pytest.raises(SmtpPermanent) as caught:
        await pool.send(SENDER, ["ap@blocked.example"], message())

    assert caught.value.stage == "data"
    assert caught.value.reply == Reply(554, "5.7.1", "Blocked by policy")
    assert sink.handler.received == []
    assert [r.stage for r in sink.handler.refusals] == ["data"]


async def test_connection_lost_after_data_is_transient_and_not_retried(make_sink, make_pool):
    sink = make_sink({"crash@*": drop_after_data()})
    pool = make_pool(sink)

    with pytest.raises(SmtpAnswerLost) as caught:  # an SmtpTransient: the job retries
        await pool.send(SENDER, ["crash@acme.example"], message())

    assert caught.value.stage == "data" and caught.value.reply is None
    # The server has the message, although the client never learnt it: sent exactly once.
    assert sink.handler.count_for("crash@acme.example") == 1
    assert pool.messages_sent == 0
    await pool.send(SENDER, [ANN], message())  # the broken connection was not pooled
    assert sink.connections == 2


async def test_slow_reply_beyond_timeout_is_transient(make_sink, make_pool):
    sink = make_sink({"slow@*": slow(5.0)})
    pool = make_pool(sink, timeout_secs=0.2)

    with pytest.raises(SmtpTransient) as caught:
        await pool.send(SENDER, ["slow@acme.example"], message())

    assert caught.value.stage == "rcpt" and caught.value.reply is None
    assert not isinstance(caught.value, SmtpAnswerLost)  # the message had not gone
    assert "timed out" in str(caught.value)
    await pool.send(SENDER, [ANN], message())
    assert pool.connections_opened == 2


async def test_421_throttles_the_next_send(make_sink, make_pool):
    sink = make_sink({"busy@*": reply("421 4.7.0 Try again later")})
    pool = make_pool(sink, throttle_secs=0.3)

    with pytest.raises(SmtpThrottled) as caught:
        await pool.send(SENDER, ["busy@acme.example"], message())
    assert caught.value.stage == "rcpt" and caught.value.reply.code == 421
    await pool.send(SENDER, [ANN], message())

    # Ordered by the server's own clock: the next message came at least throttle_secs later.
    refused_at = sink.handler.refusals[0].at
    accepted_at = sink.handler.received[0].at
    assert accepted_at - refused_at >= 0.3


async def test_server_closing_an_idle_connection_is_transparent(make_sink, make_pool):
    sink = make_sink(idle_timeout_secs=0.2)
    pool = make_pool(sink)
    await pool.send(SENDER, [ANN], message())

    await eventually(lambda: sink.open_sessions() == 0)
    delivery = await pool.send(SENDER, [ANN], message())

    assert delivery.accepted == (ANN,)
    assert sink.connections == 2 and len(sink.handler.received) == 2


async def test_dead_connection_found_at_mail_from_is_retried_once(make_sink, make_pool, caplog):
    sink = make_sink()
    pool = make_pool(sink)
    await pool.send(SENDER, [ANN], message())
    caplog.set_level(logging.DEBUG, logger="postrelay")

    # Closed by the server, and the pool's loop has not yet noticed: MAIL FROM meets a
    # dead socket, and the send goes out again on a fresh connection.
    assert sink.close_sessions() == 1
    await pool.send(SENDER, [ANN], message())

    assert len(sink.handler.received) == 2 and sink.connections == 2
    assert any(getattr(r, "event", None) == "postrelay.smtp.reconnect" for r in caplog.records)


async def test_a_stop_while_reconnecting_after_a_dead_connection_began_nothing(
        make_sink, make_pool):
    """MAIL FROM met a dead connection, so the message went nowhere; a stop while the fresh
    connection waits for its greeting must not report a transaction begun (the handler
    would log the attempt `unknown`, and hold its job under on_unknown = hold)."""
    sink = make_sink()
    pool = make_pool(sink)
    await pool.send(SENDER, [ANN], message())
    assert sink.close_sessions() == 1
    sink.stop()
    # Bound without a turn of the loop, which would let the pool see the dead connection
    # before the send takes it; a listener that never accepts, so never greets.
    silent = socket.create_server((sink.host, sink.port))
    try:
        progress = SendProgress()
        sending = asyncio.create_task(pool.send(SENDER, [ANN], message(), progress))
        await asyncio.sleep(0.3)  # MAIL FROM met the dead socket; now waiting for a greeting
        assert not sending.done()
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        assert progress.began is False
    finally:
        silent.close()


async def test_cancelled_send_discards_its_connection(make_sink, make_pool):
    sink = make_sink({"slow@*": slow(5.0)})
    pool = make_pool(sink)

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(pool.send(SENDER, ["slow@acme.example"], message()), 0.2)
    await pool.send(SENDER, [ANN], message())

    assert pool.connections_opened == 2


async def test_close_quits_idle_connections(make_sink, make_pool):
    sink = make_sink()
    pool = make_pool(sink)
    await pool.send(SENDER, [ANN], message())

    await pool.close()

    await eventually(lambda: sink.open_sessions() == 0)
    with pytest.raises(PostrelayError):
        await pool.send(SENDER, [ANN], message())


async def test_password_never_in_logs_errors_or_reprs(
    make_sink, make_pool, server_tls, ca_file, caplog
):
    good, bad = "correct-horse-battery", "wrong-staple-secret"
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="postrelay")
    sink = make_sink(tls_context=server_tls, auth={"mailer": good})
    common = {"security": "starttls", "ca_file": ca_file, "username": "mailer"}
    ok_pool = make_pool(sink, password=SecretStr(good), **common)
    bad_pool = make_pool(sink, password=SecretStr(bad), **common)

    delivery = await ok_pool.send(SENDER, [ANN], message())
    errors = []
    for _ in range(2):  # the failure, then the pause
        with pytest.raises(SmtpTransient) as caught:
            await bad_pool.send(SENDER, [ANN], message())
        errors.append(caught.value)

    texts = [repr(ok_pool.config), str(ok_pool.config), repr(bad_pool.config), repr(ok_pool),
             repr(delivery)]
    for error in errors:
        texts += [str(error), repr(error), repr(error.__cause__), repr(vars(error))]
    for record in caplog.records:
        texts += [record.getMessage(), repr(vars(record))]
    assert any("postrelay.smtp.auth_paused" in t for t in texts)
    for secret in (good, bad):
        assert not [t for t in texts if secret in t]


def test_config_from_settings():
    from postrelay.core.settings import Settings

    settings = Settings(smtp_host="mx.acme.example", smtp_port=587, smtp_security="starttls",
                        smtp_username="mailer", smtp_password="pw-in-settings",
                        smtp_pool_size=3, smtp_throttle_secs=2.0)

    config = SmtpConfig.from_settings(settings)

    assert (config.host, config.port, config.security, config.pool_size) == (
        "mx.acme.example", 587, "starttls", 3)
    assert config.password.get_secret_value() == "pw-in-settings"
    assert "pw-in-settings" not in repr(config)


async def test_sends_waiting_for_a_slot_do_not_connect_after_close(make_sink, make_pool):
    sink = make_sink({"slow@*": slow(0.2)})
    pool = make_pool(sink, pool_size=1)
    first = asyncio.create_task(pool.send(SENDER, ["slow@acme.example"], message()))
    waiting = asyncio.create_task(pool.send(SENDER, [ANN], message()))
    await eventually(lambda: sink.connections == 1)

    await pool.close()

    assert (await first).accepted == ("slow@acme.example",)
    with pytest.raises(PostrelayError, match="closed"):
        await waiting
    assert pool.connections_opened == 1
    await eventually(lambda: sink.open_sessions() == 0)
