"""The SMTP sessions of `postrelay inbound`, a real listener on loopback: what it offers
(SMTPUTF8), the limits it holds (message size, the connection cap, the idle timer) and how
it reads what MTAs write, whatever becomes of the mail after."""

from __future__ import annotations

import asyncio
import logging
import uuid

import aiosmtplib
import pytest

from postrelay.orchestrator.feedback import SuppressionPolicy
from postrelay.orchestrator.feedback.inbound import InboundConfig, InboundServer
from tests.feedback.conftest import await_inbox_empty, bounce_mail, free_port, insert_log
from tests.feedback.test_inbound import deliver


async def test_smtputf8_is_offered_and_taken(inbound, look, return_path):
    """MTAs hand a bounce that needs SMTPUTF8 (RFC 6531: UTF-8 in the headers it returns,
    say) only to a server that offers it, and drop it otherwise: test_real_mta.py replays
    Postfix's. MAIL with the SMTPUTF8 parameter and a UTF-8 address are taken."""
    reader, writer = await asyncio.open_connection("127.0.0.1", inbound.config.port)
    try:
        assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"220")
        writer.write(b"EHLO mx.example.net\r\n")
        extensions = [await asyncio.wait_for(reader.readline(), 5)]
        while not extensions[-1].startswith(b"250 "):
            extensions.append(await asyncio.wait_for(reader.readline(), 5))
        assert b"250-SMTPUTF8\r\n" in extensions
        writer.write(b"MAIL FROM:<> SMTPUTF8\r\nRCPT TO:<j\xc3\xbcrgen@%s>\r\nQUIT\r\n"
                     % return_path.domain.encode())
        replies = b""
        while b"\r\n221" not in replies:
            replies += await asyncio.wait_for(reader.read(4096), 5)
        assert [line[:3] for line in replies.splitlines()] == [b"250", b"250", b"221"]
    finally:
        writer.close()
    assert look.feedback() == []


async def test_a_message_over_the_size_cap_is_refused(inbound, look, return_path, caplog):
    """Found while reading it, or announced with SIZE: 552, and a warning for the
    operator, whose cap may be turning real reports away."""
    verp = return_path.address(uuid.uuid4())
    code, message = await deliver(inbound, verp,
                                  b"Subject: big\r\n\r\n" + b"x" * 76
                                  + (b"x" * 76 + b"\r\n") * 30_000)
    assert code == 552, message
    code, message = await deliver(inbound, verp, b"Subject: x\r\n\r\nx",
                                  mail_options=(f"SIZE={2 * 1024 * 1024}",))
    assert code == 552, message
    assert caplog.text.count("postrelay.inbound.too_big") == 2
    assert f"max_bytes={1024 * 1024}" in caplog.text
    assert look.feedback() == []


async def test_connections_past_the_cap_are_turned_away(inbound, caplog):
    held = []
    for _ in range(2):
        smtp = aiosmtplib.SMTP(hostname="127.0.0.1", port=inbound.config.port, timeout=5)
        await smtp.connect()
        held.append(smtp)
    try:
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", inbound.config.port)
            greeting = await asyncio.wait_for(reader.readline(), 5)
            assert greeting.startswith(b"421")
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
            writer.close()
        await asyncio.sleep(0.2)  # the listener's loop has seen each connection end
    finally:
        for smtp in held:
            smtp.close()
    # Quietly: each one turned away logged an ERROR with a traceback (aiosmtpd's
    # connection_lost asserting the session it never made).
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_session_that_takes_starttls_counts_once_against_the_cap(
        receiver_engine, return_path, clean_db, server_tls, ca_file):
    """aiosmtpd makes a session again once its STARTTLS handshake is done: it is still one
    connection, and its end frees its place. Counted twice, every encrypted session left a
    place taken, and soon every connection was turned away."""
    config = InboundConfig(host="127.0.0.1", port=free_port(), tls=server_tls,
                           max_connections=2)

    async def encrypted() -> aiosmtplib.SMTP:
        smtp = aiosmtplib.SMTP(hostname="127.0.0.1", port=config.port, timeout=5,
                               start_tls=False, cert_bundle=str(ca_file))
        await smtp.connect()
        await smtp.starttls()
        assert (await smtp.ehlo()).code == 250
        return smtp

    with InboundServer(receiver_engine, return_path, SuppressionPolicy(), config):
        for _ in range(3):  # more sessions, one after the other, than the cap
            await (await encrypted()).quit()
        held = [await encrypted(), await encrypted()]  # the cap, at once
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", config.port)
            assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"421")
            writer.close()
        finally:
            for smtp in held:
                await smtp.quit()
        await (await encrypted()).quit()  # their places free again


@pytest.mark.parametrize("arg", [
    "<>", "<> SIZE=5", "<ann@example.com>", "<ann@example.com> SIZE=12 BODY=8BITMIME",
    " <ann@example.com>", "<a.b+c@mx.example.com>  ", '<"x y"@example.com>',
    "<@route:ann@example.com>", "<ann@[192.0.2.1]>", "ann@example.com",
    "<ann@example.com> (comment) SIZE=1", "<ann@example.com>x", "<a..b@example.com>",
])
def test_the_receiver_reads_smtp_paths_as_aiosmtpd_does(arg):
    """The plain `<local@domain>` path is read without email's full parser; every path
    reads the same as aiosmtpd's own reading."""
    from aiosmtpd.smtp import SMTP

    from postrelay.orchestrator.feedback.session import ReceiverSession

    server = ReceiverSession.__new__(ReceiverSession)
    for limit in (0, 3):
        server.local_part_limit = limit
        assert server._getaddr(arg) == SMTP._getaddr(server, arg)


@pytest.mark.parametrize("command", ["DATA", "BDAT"])
async def test_a_message_sent_slowly_is_not_cut_off_but_an_idle_session_is(
        receiver_engine, engine, tenant, look, return_path, clean_db, command):
    """aiosmtpd restarts its idle timer at each command only: a message still arriving (a
    large DSN on a slow link) was cut off that long after its DATA or BDAT, and the MTA's
    retries met the same end. Here the timer is 1.5 s and the message takes 3 s."""
    config = InboundConfig(host="127.0.0.1", port=free_port(), idle_timeout_secs=1.5)
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    verp = return_path.address(sent["id"])
    raw = bounce_mail("postfix_bounce.eml", verp=verp, message_id=sent["message_id"])
    pieces = [raw[i:i + len(raw) // 6 + 1] for i in range(0, len(raw), len(raw) // 6 + 1)]
    with InboundServer(receiver_engine, return_path, SuppressionPolicy(), config):
        reader, writer = await asyncio.open_connection("127.0.0.1", config.port)
        try:
            await asyncio.wait_for(reader.readline(), 5)
            writer.write(b"EHLO mx.example.net\r\n")
            while not (await asyncio.wait_for(reader.readline(), 5)).startswith(b"250 "):
                pass
            head = b"DATA\r\n" if command == "DATA" else b"BDAT %d LAST\r\n" % len(raw)
            writer.write(b"MAIL FROM:<>\r\nRCPT TO:<%s>\r\n%s" % (verp.encode(), head))
            if command == "DATA":  # the replies to MAIL and RCPT, and the 354
                for _ in range(3):
                    assert (await asyncio.wait_for(reader.readline(), 5))[:1] in (b"2", b"3")
            for piece in pieces:
                writer.write(piece)
                await asyncio.sleep(0.5)
            if command == "DATA":
                writer.write(b".\r\n")
            if command == "BDAT":  # the replies to MAIL and RCPT came with the chunk's
                for _ in range(2):
                    assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"250")
            assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"250")
            await asyncio.sleep(2.5)  # now idle: closed
            assert await asyncio.wait_for(reader.read(), 5) == b""
        finally:
            writer.close()
        await await_inbox_empty(engine)
    assert look.log(sent["id"])["delivery"] == "bounced"


async def test_sessions_timed_out_in_their_tls_handshake_give_their_places_back(
        receiver_engine, return_path, clean_db, server_tls):
    """Sessions that said STARTTLS and then nothing were closed at the idle timeout, but
    kept their places under the cap: every later connection was turned away."""
    config = InboundConfig(host="127.0.0.1", port=free_port(), tls=server_tls,
                           max_connections=2, idle_timeout_secs=1.0)
    with InboundServer(receiver_engine, return_path, SuppressionPolicy(), config):
        silent = []
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", config.port)
            await asyncio.wait_for(reader.readline(), 5)
            writer.write(b"EHLO mx.example.net\r\n")
            while not (await asyncio.wait_for(reader.readline(), 5)).startswith(b"250 "):
                pass
            writer.write(b"STARTTLS\r\n")
            assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"220")
            silent.append((reader, writer))  # and no TLS handshake follows
        try:
            for reader, _ in silent:
                assert await asyncio.wait_for(reader.read(), 5) == b""  # timed out
            reader, writer = await asyncio.open_connection("127.0.0.1", config.port)
            assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"220")
            writer.close()
        finally:
            for _, writer in silent:
                writer.close()
