"""CHUNKING (RFC 3030) in `postrelay inbound`: a DSN sent as BDAT, the message in the same
write as MAIL and RCPT, as Gmail, Microsoft 365 and Exim send it; over a raw loopback socket
to the real listener, recorded on the real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.feedback.conftest import await_inbox_empty, bounce_mail, insert_log

ANN = "ann@example.com"


class Client:
    """One SMTP session, written and read as bytes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.offers: list[bytes] = []  # the EHLO reply's lines

    @classmethod
    async def open(cls, port: int) -> Client:
        client = cls(*await asyncio.open_connection("127.0.0.1", port))
        assert (await client.line()).startswith(b"220")
        client.writer.write(b"EHLO mx.example.net\r\n")
        client.offers = [await client.line()]
        while not client.offers[-1].startswith(b"250 "):
            client.offers.append(await client.line())
        return client

    async def line(self) -> bytes:
        return await asyncio.wait_for(self.reader.readline(), 5)

    async def replies(self, n: int) -> list[bytes]:
        return [(await self.line()).rstrip() for _ in range(n)]

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
def stored(inbound, monkeypatch) -> list[bytes]:
    """The raw messages the receiver stores in its inbox, as it stores them."""
    kept: list[bytes] = []
    store = inbound.feedback.spool.store

    async def keeping(envelope_to, raw):
        kept.append(raw)
        await store(envelope_to, raw)

    monkeypatch.setattr(inbound.feedback.spool, "store", keeping)
    return kept


async def test_a_bounce_in_one_bdat_chunk_is_answered_in_one_write_and_recorded(
        inbound, engine, tenant, look, return_path, stored, written):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    verp = return_path.address(sent["id"])
    raw = bounce_mail("postfix_bounce.eml", verp=verp, message_id=sent["message_id"])
    client = await Client.open(inbound.config.port)
    try:
        assert b"250-CHUNKING\r\n" in client.offers
        client.writer.write(b"MAIL FROM:<>\r\nRCPT TO:<%s>\r\nBDAT %d LAST\r\n%s"
                            % (verp.encode(), len(raw), raw))
        replies = await asyncio.wait_for(client.reader.readuntil(b"queued\r\n"), 5)
    finally:
        client.close()
    assert [r[:3] for r in replies.splitlines()] == [b"250", b"250", b"250"]
    assert written[-1] == replies  # in one write: the client waits for one read, not three
    assert stored == [raw]
    await await_inbox_empty(look.engine)
    assert look.log(sent["id"])["delivery"] == "bounced"
    assert (ANN, "") in look.suppressed(tenant)


async def test_a_message_in_several_chunks_is_stored_whole_and_as_sent(
        inbound, return_path, stored):
    verp = return_path.address(uuid.uuid4()).encode()
    parts = [b"Subject: chunks\r\n\r\n.a leading dot stays one\r\n", b"middle\r\n.\r\n", b""]
    client = await Client.open(inbound.config.port)
    try:
        client.writer.write(b"MAIL FROM:<>\r\nRCPT TO:<%s>\r\n" % verp)
        for i, part in enumerate(parts):
            last = b" LAST" if i == len(parts) - 1 else b""
            client.writer.write(b"BDAT %d%s\r\n%s" % (len(part), last, part))
        replies = await client.replies(5)
    finally:
        client.close()
    assert replies[2:4] == [b"250 2.0.0 OK: %d bytes" % len(parts[0]),
                            b"250 2.0.0 OK: %d bytes" % len(parts[1])]
    assert replies[4].startswith(b"250 2.0.0")
    assert stored == [b"".join(parts)]


async def test_a_refused_chunk_is_still_read_and_the_session_goes_on(
        inbound, return_path, stored):
    """A chunk's bytes are never taken for commands, whatever the reply to it: here they
    spell QUIT, which the session would obey if it read them as one."""
    verp = return_path.address(uuid.uuid4()).encode()
    quit_ = b"QUIT\r\n"
    big = b"x" * 600_000  # two of them pass the 1 MB cap
    client = await Client.open(inbound.config.port)
    try:
        client.writer.write(b"BDAT %d LAST\r\n%s" % (len(quit_), quit_))
        assert (await client.replies(1))[0].startswith(b"503 5.5.1")  # no RCPT yet
        client.writer.write(b"MAIL FROM:<>\r\nRCPT TO:<%s>\r\nBDAT %d\r\n%sBDAT %d\r\n%s"
                            b"BDAT %d LAST\r\n%s" % (verp, len(big), big, len(big), big,
                                                     len(quit_), quit_))
        replies = await client.replies(5)
        assert [r[:3] for r in replies] == [b"250", b"250", b"250", b"552", b"552"]
        client.writer.write(b"MAIL FROM:<>\r\nRCPT TO:<%s>\r\nBDAT 4\r\nabc\nDATA\r\n" % verp)
        replies = await client.replies(4)
        assert replies[3].startswith(b"503 5.5.1 Error: DATA after BDAT")
        client.writer.write(b"RSET\r\nMAIL FROM:<>\r\nRCPT TO:<%s>\r\nBDAT %d LAST\r\n%s"
                            % (verp, len(quit_), quit_))
        assert [r[:3] for r in await client.replies(4)] == [b"250"] * 4
    finally:
        client.close()
    assert stored == [quit_]  # the message over the cap was never stored, nor kept


async def test_a_bdat_without_a_size_is_refused_and_the_session_ends(inbound):
    client = await Client.open(inbound.config.port)
    try:
        client.writer.write(b"BDAT lots LAST\r\nQUIT\r\n")
        assert (await client.line()).startswith(b"501 5.5.4")
        assert await asyncio.wait_for(client.reader.read(), 5) == b""  # closed, QUIT unread
    finally:
        client.close()


async def test_a_client_gone_mid_chunk_leaves_nothing_and_the_next_is_served(
        inbound, return_path, stored):
    verp = return_path.address(uuid.uuid4()).encode()
    client = await Client.open(inbound.config.port)
    client.writer.write(b"MAIL FROM:<>\r\nRCPT TO:<%s>\r\nBDAT 1000 LAST\r\nonly part" % verp)
    await client.writer.drain()
    client.close()  # the replies to MAIL and RCPT wait for the chunk's: none come
    again = await Client.open(inbound.config.port)
    try:
        again.writer.write(b"MAIL FROM:<>\r\nRCPT TO:<%s>\r\nBDAT 4 LAST\r\nwhole" % verp)
        assert [r[:3] for r in await again.replies(3)] == [b"250"] * 3
    finally:
        again.close()
    assert stored == [b"whol"]


async def test_a_bdat_refused_before_mail_leaves_the_next_transaction_alone(
        inbound, return_path, stored):
    """The refusal stayed with aiosmtpd's Envelope, which MAIL reuses: the message of the
    transaction that MAIL started got 503, which an MTA takes as final."""
    verp = return_path.address(uuid.uuid4()).encode()
    client = await Client.open(inbound.config.port)
    try:
        client.writer.write(b"BDAT 3\r\nabc")
        assert (await client.replies(1))[0].startswith(b"503 5.5.1")
        client.writer.write(b"MAIL FROM:<>\r\nRCPT TO:<%s>\r\nBDAT 5 LAST\r\nhello" % verp)
        assert [r[:3] for r in await client.replies(3)] == [b"250"] * 3
    finally:
        client.close()
    assert stored == [b"hello"]


async def test_a_bare_bdat_is_a_syntax_error(inbound):
    client = await Client.open(inbound.config.port)
    try:
        client.writer.write(b"BDAT\r\n")
        assert (await client.line()).startswith(b"501 5.5.4")  # not a Python exception
    finally:
        client.close()


async def test_replies_held_for_pipelining_go_while_a_chunk_is_still_arriving(
        inbound, return_path, stored):
    """RFC 2920 3.2: held replies go once the input is used up; they waited for the rest
    of the chunk."""
    verp = return_path.address(uuid.uuid4()).encode()
    body = b"Subject: slow\r\n\r\n" + b"x" * 22
    client = await Client.open(inbound.config.port)
    try:
        client.writer.write(b"MAIL FROM:<>\r\nRCPT TO:<%s>\r\nBDAT %d LAST\r\n%s"
                            % (verp, len(body), body[:16]))
        assert [r[:3] for r in await client.replies(2)] == [b"250", b"250"]
        client.writer.write(body[16:])
        assert (await client.replies(1))[0].startswith(b"250 2.0.0")
    finally:
        client.close()
    assert stored == [body]


@pytest.mark.parametrize("command", [b"DATA", b"BDAT"])
async def test_help_describes_data_and_bdat(inbound, command):
    client = await Client.open(inbound.config.port)
    try:
        client.writer.write(b"HELP %s\r\n" % command)
        assert (await client.line()).startswith(b"250 Syntax: " + command)
    finally:
        client.close()
