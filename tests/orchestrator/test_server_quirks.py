"""SmtpPool against real aiosmtpd servers that misbehave (smtp_helpers.quirky): replies of
an unexpected class, servers that know only HELO, hang up or go silent mid-transaction,
or answer with replies that are garbled, long or not ASCII. Each send ends with the error
its outcome needs (or a delivery), and a connection that is out of step is never reused."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import SecretStr

from postrelay.orchestrator.transport import (
    SmtpAnswerLost,
    SmtpConfigError,
    SmtpPermanent,
    SmtpThrottled,
    SmtpTransient,
)
from postrelay.testing import SmtpSink, reply
from tests.orchestrator.smtp_helpers import HANG, SENDER, Script, message, quirky

ANN = "ann@acme.example"
BOB = "bob@acme.example"
EHLO_UNKNOWN = [b"500 Error: command \"EHLO\" not recognized",
                b"502 5.5.1 Command not implemented"]


@pytest.fixture(params=[True, False], ids=["pipelining", "no-pipelining"])
def make_quirky(request, make_sink) -> Callable[..., tuple[SmtpSink, Script]]:
    """A server following a Script, with PIPELINING offered and without."""

    def make(**options) -> tuple[SmtpSink, Script]:
        script = Script()
        options.setdefault("pipelining", request.param)
        return make_sink(server_class=quirky(script), **options), script

    return make


def transactions(script: Script) -> int:
    return script.commands.count("MAIL")


# 1. Every 2xx is a positive completion (RFC 5321 4.2.1); 1xx and 3xx are not verdicts.

@pytest.mark.parametrize("final", [b"251 2.1.5 Forwarded", b"200", b"252 2.0.0 Queued as X1",
                                   b"299 ok"])
async def test_any_2xx_to_the_message_is_a_delivery(make_quirky, make_pool, final):
    """A 2xx other than 250 was taken for a transient failure: retried, the message went
    twice."""
    sink, script = make_quirky()
    script.replies["END"] = final
    pool = make_pool(sink)

    delivery = await pool.send(SENDER, [ANN], message())
    again = await pool.send(SENDER, [BOB], message())

    code = int(final[:3])
    assert delivery.accepted == (ANN,) and delivery.reply.code == code
    assert delivery.queue_id == ("X1" if code == 252 else None)
    assert again.reply.code == code
    assert len(sink.handler.received) == 2 and pool.messages_sent == 2
    assert sink.connections == 1  # in step: reused


async def test_2xx_to_mail_and_rcpt_are_accepted(make_quirky, make_pool):
    sink, script = make_quirky()
    script.replies.update(MAIL=b"252 2.1.0 Sender ok", RCPT=b"251 2.1.5 User not local; will "
                                                             b"forward")
    pool = make_pool(sink)

    delivery = await pool.send(SENDER, [ANN, BOB], message())

    assert delivery.accepted == (ANN, BOB) and delivery.refused == {}
    assert sink.handler.received[0].recipients == (ANN, BOB)


@pytest.mark.parametrize("final", [b"354 Go ahead", b"199 Wait", b"334 What?"])
async def test_a_1xx_or_3xx_to_the_message_is_no_delivery_and_its_outcome_is_unknown(
        make_quirky, make_pool, final):
    """The server has the message and said neither yes nor no: it may have taken it."""
    sink, script = make_quirky()
    script.replies["END"] = final
    pool = make_pool(sink)

    with pytest.raises(SmtpAnswerLost) as caught:
        await pool.send(SENDER, [ANN], message())

    assert caught.value.stage == "data" and final.decode()[:3] in str(caught.value)
    assert pool.messages_sent == 0
    script.replies.clear()
    await pool.send(SENDER, [BOB], message())
    assert pool.connections_opened == 2  # out of step: never reused


@pytest.mark.parametrize(("stage", "odd"), [
    ("MAIL", b"354 Go ahead"), ("RCPT", b"150 Hmm"), ("DATA", b"250 OK, no data then"),
    ("MAIL", b"600 Bad code"),
])
async def test_a_reply_of_no_class_where_a_verdict_is_due_fails_the_send_unsent(
        make_quirky, make_pool, stage, odd):
    sink, script = make_quirky()
    script.replies[stage] = odd
    pool = make_pool(sink)

    with pytest.raises(SmtpTransient) as caught:
        await pool.send(SENDER, [ANN], message())

    assert not isinstance(caught.value, SmtpAnswerLost | SmtpPermanent)
    assert caught.value.stage == stage.lower() and odd.decode() in str(caught.value)
    assert sink.handler.received == []
    script.replies.clear()
    await pool.send(SENDER, [BOB], message())
    assert pool.connections_opened == 2


# 2. A server that refuses EHLO as unknown: HELO, and no extension.

@pytest.mark.parametrize("refusal", EHLO_UNKNOWN)
async def test_a_server_that_does_not_know_ehlo_is_greeted_with_helo(
        make_quirky, make_pool, refusal):
    sink, script = make_quirky()
    script.replies["EHLO"] = refusal
    pool = make_pool(sink)

    for n in range(2):
        await pool.send(SENDER, [ANN, BOB], message(subject=f"n{n}"))

    assert [r.message["Subject"] for r in sink.handler.received] == ["n0", "n1"]
    assert script.commands[:6] == ["EHLO", "HELO", "MAIL", "RCPT", "RCPT", "DATA"]
    assert sink.connections == 1


@pytest.mark.parametrize("refusal", [b"421 4.3.2 Not now", b"554 5.7.1 Go away",
                                     b"501 5.5.4 Bad hostname"])
async def test_other_refusals_of_ehlo_are_not_taken_for_an_old_server(
        make_quirky, make_pool, refusal):
    sink, script = make_quirky()
    script.replies["EHLO"] = refusal
    pool = make_pool(sink)

    with pytest.raises(SmtpTransient) as caught:
        await pool.send(SENDER, [ANN], message())

    assert caught.value.stage == "connect" and caught.value.reply.code == int(refusal[:3])
    assert isinstance(caught.value, SmtpThrottled) == refusal.startswith(b"421")
    assert script.commands == ["EHLO"]


@pytest.mark.parametrize("refusal", EHLO_UNKNOWN)
async def test_starttls_required_of_a_helo_only_server_fails_as_misconfigured(
        make_quirky, make_pool, server_tls, ca_file, refusal):
    """Never in clear text, and no STARTTLS a HELO session does not offer: the setting
    cannot be met, which no retry changes."""
    sink, script = make_quirky(tls_context=server_tls)
    script.replies["EHLO"] = refusal
    pool = make_pool(sink, security="starttls", ca_file=ca_file)

    with pytest.raises(SmtpConfigError) as caught:
        await pool.send(SENDER, [ANN], message())

    error = caught.value
    assert isinstance(error, SmtpPermanent) and error.stage == "tls"
    assert error.reply.code == int(refusal[:3]) and refusal.decode() in str(error)
    assert "STARTTLS" in str(error) and "POSTRELAY_SMTP_SECURITY" in str(error)
    assert script.commands == ["EHLO", "HELO"] and sink.handler.received == []
    assert pool.connections_opened == 0


async def test_auth_required_of_a_helo_only_server_fails_as_misconfigured(
        make_quirky, make_pool):
    sink, script = make_quirky(auth={"mailer": "s3cret"}, auth_require_tls=False)
    script.replies["EHLO"] = EHLO_UNKNOWN[1]
    pool = make_pool(sink, username="mailer", password=SecretStr("s3cret"))

    with pytest.raises(SmtpConfigError) as caught:
        await pool.send(SENDER, [ANN], message())

    assert caught.value.stage == "auth" and caught.value.reply.code == 502
    assert "AUTH" in str(caught.value) and "POSTRELAY_SMTP_USERNAME" in str(caught.value)
    assert "s3cret" not in str(caught.value)
    assert script.commands == ["EHLO", "HELO"] and sink.handler.received == []
    assert pool.paused_for() == 0.0  # not a credentials problem: no pause


async def test_implicit_tls_to_a_helo_only_server_sends(make_quirky, make_pool, server_tls,
                                                        ca_file):
    sink, script = make_quirky(ssl_context=server_tls)
    script.replies["EHLO"] = EHLO_UNKNOWN[0]
    pool = make_pool(sink, security="tls", ca_file=ca_file)

    await pool.send(SENDER, [ANN], message())

    assert sink.handler.received[0].tls and script.commands[:2] == ["EHLO", "HELO"]


@pytest.mark.parametrize("helo_only", [True, False], ids=["helo", "ehlo-without-them"])
async def test_what_needs_smtputf8_or_8bitmime_fails_by_name_where_they_are_not_offered(
        make_quirky, make_pool, helo_only):
    """An 8-bit message sent as it is to a server that did not say it takes one may be cut
    to 7 bits on its way."""
    sink, script = make_quirky()
    if helo_only:
        script.replies["EHLO"] = EHLO_UNKNOWN[1]
    else:
        script.withhold.update({"8BITMIME", "SMTPUTF8"})
    pool = make_pool(sink)

    with pytest.raises(SmtpPermanent, match="SMTPUTF8") as utf8:
        await pool.send(SENDER, ["jürgen@bücher.example"], message())
    eight_bit = message().replace(b"Hello,", "Grüße,".encode())
    with pytest.raises(SmtpPermanent, match="8BITMIME") as eight:
        await pool.send(SENDER, [ANN], eight_bit)
    await pool.send(SENDER, [ANN], message())  # 7-bit, ASCII addresses: sent

    assert utf8.value.stage == eight.value.stage == "mail"
    assert not isinstance(utf8.value, SmtpConfigError)
    assert transactions(script) == 1 and len(sink.handler.received) == 1
    assert pool.connections_opened == 1


# 3. Servers that hang up, go silent or garble their replies mid-transaction.

async def test_a_server_that_hangs_up_after_mail_fails_the_send_unsent(make_quirky, make_pool):
    sink, script = make_quirky()
    script.close_after.add("MAIL")
    pool = make_pool(sink)

    with pytest.raises(SmtpTransient) as caught:
        await pool.send(SENDER, [ANN], message())

    assert caught.value.stage == "rcpt" and caught.value.reply is None
    assert not isinstance(caught.value, SmtpAnswerLost)  # the message never went
    script.close_after.clear()
    await pool.send(SENDER, [BOB], message())
    assert pool.connections_opened == 2 and len(sink.handler.received) == 1


@pytest.mark.parametrize("stage", ["MAIL", "RCPT", "DATA", "END"])
async def test_a_421_mid_transaction_throttles_and_the_closed_connection_is_dropped(
        make_quirky, make_pool, stage):
    sink, script = make_quirky()
    script.replies[stage] = b"421 4.3.2 Shutting down"
    script.close_after.add(stage)
    pool = make_pool(sink, throttle_secs=0.05)

    with pytest.raises(SmtpThrottled) as caught:
        await pool.send(SENDER, [ANN], message())

    assert caught.value.stage == ("data" if stage == "END" else stage.lower())
    assert caught.value.reply.code == 421  # an answer: the server did not take it
    script.replies.clear()
    script.close_after.clear()
    await pool.send(SENDER, [BOB], message())
    assert pool.connections_opened == 2
    assert [r.recipients for r in sink.handler.received] == (
        [(ANN,), (BOB,)] if stage == "END" else [(BOB,)])


async def test_a_server_silent_after_the_message_leaves_its_outcome_unknown(
        make_quirky, make_pool):
    sink, script = make_quirky()
    script.replies["END"] = HANG
    pool = make_pool(sink, timeout_secs=0.3)

    with pytest.raises(SmtpAnswerLost) as caught:
        await pool.send(SENDER, [ANN], message())

    assert caught.value.stage == "data" and "timed out" in str(caught.value)
    assert len(sink.handler.received) == 1  # it has the message
    script.replies.clear()
    await pool.send(SENDER, [BOB], message())
    assert pool.connections_opened == 2


@pytest.mark.parametrize("garbled", [b"550-5.7.1 Rejected\r\n250 2.0.0 Ok: queued as Q1",
                                     b"250-2.0.0 Ok: queued as Q1\r\n554 5.7.1 Rejected",
                                     b"250-2.0.0 Ok\r\n451 4.3.0 Oops\r\n250 2.0.0 Ok"])
async def test_a_multiline_reply_whose_lines_disagree_about_the_message_is_no_verdict(
        make_quirky, make_pool, garbled):
    """One line says yes, another no: neither can be recorded, and the server has the
    message."""
    sink, script = make_quirky()
    script.replies["END"] = garbled
    pool = make_pool(sink)

    with pytest.raises(SmtpAnswerLost) as caught:
        await pool.send(SENDER, [ANN], message())

    assert caught.value.stage == "data"
    script.replies.clear()
    await pool.send(SENDER, [BOB], message())
    assert pool.connections_opened == 2


async def test_a_multiline_reply_whose_lines_disagree_about_a_recipient_fails_unsent(
        make_quirky, make_pool):
    sink, script = make_quirky()
    script.replies["RCPT"] = b"250-2.1.5 Ok\r\n550 5.1.1 No such user"
    pool = make_pool(sink)

    with pytest.raises(SmtpTransient) as caught:
        await pool.send(SENDER, [ANN], message())

    assert not isinstance(caught.value, SmtpAnswerLost | SmtpPermanent)
    assert caught.value.stage == "rcpt" and caught.value.refused == {}
    assert sink.handler.received == []


async def test_a_multiline_reply_of_one_class_is_read_with_its_last_code(
        make_quirky, make_pool):
    sink, script = make_quirky()
    script.replies["END"] = b"250-2.0.0 Ok: queued as Q1\r\n251 2.0.0 and forwarded"
    pool = make_pool(sink)

    delivery = await pool.send(SENDER, [ANN], message())

    assert delivery.reply.code == 251 and delivery.queue_id == "Q1"
    assert sink.connections == 1


@pytest.mark.parametrize("final", [
    b"250 2.0.0 Ok: " + b"x" * 5000,  # one line ten times RFC 5321's 512 octets
    b"\r\n".join([b"250-2.0.0 line %d" % n for n in range(300)] + [b"250 2.0.0 done"]),
    "250 2.0.0 Übernommen: queued as Q1".encode("latin-1"),
    b"250 2.0.0 Ok: queued as " + b"Q" * 3000,  # no queue id is that long
])
async def test_long_or_non_ascii_accepting_replies_are_deliveries(make_quirky, make_pool,
                                                                  final):
    sink, script = make_quirky()
    script.replies["END"] = final
    pool = make_pool(sink)

    delivery = await pool.send(SENDER, [ANN], message())
    await pool.send(SENDER, [BOB], message())

    assert delivery.reply.code == 250
    assert delivery.queue_id == ("Q1" if b"Q1" in final else None)
    assert sink.connections == 1


async def test_a_long_refusal_is_read_whole(make_quirky, make_pool):
    sink, _ = make_quirky()
    sink.handler.rules = [(ANN, reply("550 5.1.1 " + "no such user " * 400))]
    pool = make_pool(sink)

    with pytest.raises(SmtpPermanent) as caught:
        await pool.send(SENDER, [ANN], message())
    await pool.send(SENDER, [BOB], message())

    assert caught.value.reply.enhanced == "5.1.1"
    assert len(caught.value.reply.text) > 5000
    assert sink.connections == 1



@pytest.mark.parametrize(("stage", "then_garbage"), [
    ("MAIL", b"250 2.1.0 Ok\r\nhello there"), ("DATA", b"354 Go ahead\r\nhello there")])
async def test_a_connection_lost_before_the_next_command_went_fails_that_command_unsent(
        make_quirky, make_pool, stage, then_garbage):
    """A reply followed by a garbled line: the dialogue reads the reply, then drops the
    connection, before the next command (a RCPT, or the message) is written. The write
    raised aiosmtplib's own error past the pool; the message never went."""
    sink, script = make_quirky()
    script.replies[stage] = then_garbage
    pool = make_pool(sink)

    with pytest.raises(SmtpTransient) as caught:
        await pool.send(SENDER, [ANN], message())

    assert not isinstance(caught.value, SmtpAnswerLost)
    assert caught.value.stage == ("rcpt" if stage == "MAIL" else "data")
    assert "Malformed" in str(caught.value) and sink.handler.received == []
    script.replies.clear()
    await pool.send(SENDER, [BOB], message())
    assert pool.connections_opened == 2
