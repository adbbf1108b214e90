"""CHUNKING (RFC 3030) on the sending side: where the server offers it with PIPELINING, the
pool sends MAIL, the RCPTs and the whole message as one `BDAT <size> LAST` in one write.

The server here is a small scripted one on loopback (aiosmtpd has no BDAT): it answers a
transaction only once its BDAT chunk is in, so a client that waited for a reply before
sending the message would wait until its timeout."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from postrelay.orchestrator import SmtpConfig, SmtpPool
from postrelay.orchestrator.transport import (
    SmtpAnswerLost,
    SmtpPermanent,
    SmtpThrottled,
    SmtpTransient,
)
from tests.orchestrator.smtp_helpers import SENDER

ANN = "ann@acme.example"
BOB = "bob@acme.example"
MESSAGE = b"Subject: dots\nFrom: app@postrelay.example\n\n.a line with a leading dot\nend"
ON_THE_WIRE = (b"Subject: dots\r\nFrom: app@postrelay.example\r\n\r\n"
               b".a line with a leading dot\r\nend\r\n")  # CRLF ends, no dot-stuffing


class ChunkingServer:
    """PIPELINING and CHUNKING (or DATA only, `chunking=False`); `refuse` maps a recipient
    to the reply its RCPT gets. Keeps the commands and each accepted message."""

    def __init__(self, refuse: dict[str, bytes] | None = None, chunking: bool = True) -> None:
        self.refuse = refuse or {}
        self.chunking = chunking
        self.vanish_after = 0  # > 0: after that many chunks, hang up without replying
        self.taken = b"250 2.0.0 OK: queued as Q1"  # the reply to a chunk it takes
        self.commands: list[bytes] = []
        self.messages: list[tuple[list[str], bytes]] = []
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> ChunkingServer:
        self._server = await asyncio.start_server(self._session, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.write(b"220 chunking.test ESMTP\r\n")
        held: list[bytes] = []  # replies of the transaction, sent once its message is in
        rcpts: list[str] = []
        while line := await reader.readline():
            self.commands.append(line)
            verb = line[:4].upper()
            if verb == b"EHLO":
                offered = b"250-CHUNKING\r\n" if self.chunking else b""
                writer.write(b"250-chunking.test\r\n250-PIPELINING\r\n" + offered
                             + b"250 8BITMIME\r\n")
            elif verb == b"MAIL":
                rcpts = []
                held.append(b"250 2.1.0 OK")
            elif verb == b"RCPT":
                address = line.split(b":", 1)[1].strip()[1:-1].decode()
                refusal = self.refuse.get(address)
                held.append(refusal or b"250 2.1.5 OK")
                if refusal is None:
                    rcpts.append(address)
            elif verb == b"BDAT":
                size = int(line.split()[1])
                data = await reader.readexactly(size)
                closing = [n for n, reply in enumerate(held) if reply.startswith(b"421")]
                if closing:  # a 421 closes the connection (RFC 5321 3.8): nothing is taken
                    writer.write(b"".join(reply + b"\r\n" for reply in held[:closing[0] + 1]))
                    break
                if rcpts:
                    self.messages.append((rcpts, data))
                if self.vanish_after and len(self.messages) == self.vanish_after:
                    break  # taken, and the connection lost before any reply
                held.append(self.taken if rcpts else b"554 5.5.1 Error: no valid recipients")
                writer.write(b"".join(reply + b"\r\n" for reply in held))
                held = []
            elif verb == b"DATA":
                writer.write(b"".join(reply + b"\r\n" for reply in [*held, b"354 go on"]))
                held = []
                data = await reader.readuntil(b"\r\n.\r\n")
                self.messages.append((rcpts, data[:-3]))
                writer.write(b"250 2.0.0 OK: queued as Q2\r\n")
            elif verb == b"QUIT":
                writer.write(b"221 bye\r\n")
                break
            else:  # RSET
                writer.write(b"".join(reply + b"\r\n" for reply in [*held, b"250 OK"]))
                held = []
        writer.close()


@pytest.fixture
async def servers() -> AsyncIterator[list[ChunkingServer]]:
    started: list[ChunkingServer] = []
    yield started
    for server in started:
        await server.stop()


async def pool_to(servers: list[ChunkingServer], server: ChunkingServer,
                  **overrides: object) -> SmtpPool:
    servers.append(await server.start())
    return SmtpPool(SmtpConfig(host="127.0.0.1", port=server.port, pool_size=1,
                               timeout_secs=5.0, **overrides))  # type: ignore[arg-type]


async def test_the_message_goes_with_mail_and_rcpt_as_one_bdat_chunk(servers):
    server = ChunkingServer()
    pool = await pool_to(servers, server)
    try:
        delivery = await pool.send(SENDER, [ANN, BOB], MESSAGE)
    finally:
        await pool.close()

    assert delivery.accepted == (ANN, BOB) and delivery.queue_id == "Q1"
    assert server.messages == [([ANN, BOB], ON_THE_WIRE)]
    assert b"BDAT %d LAST\r\n" % len(ON_THE_WIRE) in server.commands
    assert not any(c.startswith(b"DATA") for c in server.commands)


async def test_chunking_turned_off_sends_data_though_it_is_offered(servers):
    server = ChunkingServer()
    pool = await pool_to(servers, server, chunking=False)
    try:
        delivery = await pool.send(SENDER, [ANN], MESSAGE)
    finally:
        await pool.close()

    assert delivery.queue_id == "Q2"
    assert b"DATA\r\n" in server.commands
    assert server.messages == [([ANN], ON_THE_WIRE.replace(b"\n.", b"\n.."))]


async def test_every_recipient_refused_reads_the_chunks_refusal_and_stays_in_step(servers):
    server = ChunkingServer(refuse={ANN: b"550 5.1.1 No such user"})
    pool = await pool_to(servers, server)
    try:
        with pytest.raises(SmtpPermanent) as caught:
            await pool.send(SENDER, [ANN], MESSAGE)
        delivery = await pool.send(SENDER, [BOB], MESSAGE)
    finally:
        await pool.close()

    assert caught.value.stage == "rcpt" and caught.value.reply.code == 550
    assert delivery.accepted == (BOB,)
    assert server.messages == [([BOB], ON_THE_WIRE)]
    assert b"RSET\r\n" in server.commands and server.connections == 1


async def test_a_throttled_recipient_beside_an_accepted_one_is_a_partial_delivery(
        servers, caplog):
    """With DATA the pool backs off before the message leaves; with BDAT it has left, and
    the server takes it for the accepted recipient: that is a delivery, and the pool still
    backs off before its next send."""
    server = ChunkingServer(refuse={BOB: b"454 4.7.0 Slow down"})
    pool = await pool_to(servers, server, throttle_secs=0.05)
    try:
        with caplog.at_level(logging.WARNING, logger="postrelay"):
            delivery = await pool.send(SENDER, [ANN, BOB], MESSAGE)
    finally:
        await pool.close()

    assert delivery.accepted == (ANN,) and delivery.refused[BOB].code == 454
    assert server.messages == [([ANN], ON_THE_WIRE)]
    assert any("postrelay.smtp.throttled" in r.getMessage() for r in caplog.records)


async def test_a_chunk_lost_without_a_reply_is_not_sent_again_on_a_fresh_connection(servers):
    """With DATA, a reused connection found closed before any reply is reopened and the
    message sent there: it never left. With BDAT it went with the commands and may have
    been taken, so the send fails as transient and a retry is left to the job."""
    server = ChunkingServer()
    server.vanish_after = 2
    pool = await pool_to(servers, server)
    try:
        await pool.send(SENDER, [ANN], MESSAGE)
        with pytest.raises(SmtpTransient) as caught:
            await pool.send(SENDER, [BOB], MESSAGE)
    finally:
        await pool.close()

    assert caught.value.stage == "mail" and caught.value.reply is None
    assert isinstance(caught.value, SmtpAnswerLost)  # the chunk went: it may be taken
    assert [rcpts for rcpts, _ in server.messages] == [[ANN], [BOB]]
    assert server.connections == 1


@pytest.mark.parametrize("taken", [b"251 2.0.0 Forwarded", b"200"])
async def test_any_2xx_to_the_chunk_is_a_delivery(servers, taken):
    server = ChunkingServer()
    server.taken = taken
    pool = await pool_to(servers, server)
    try:
        delivery = await pool.send(SENDER, [ANN], MESSAGE)
        await pool.send(SENDER, [BOB], MESSAGE)
    finally:
        await pool.close()

    assert delivery.accepted == (ANN,) and delivery.reply.code == int(taken[:3])
    assert len(server.messages) == 2 and server.connections == 1


async def test_a_3xx_to_the_chunk_leaves_its_outcome_unknown(servers):
    server = ChunkingServer()
    server.taken = b"354 Go on"
    pool = await pool_to(servers, server)
    try:
        with pytest.raises(SmtpAnswerLost) as caught:
            await pool.send(SENDER, [ANN], MESSAGE)
        server.taken = b"250 2.0.0 OK: queued as Q1"
        await pool.send(SENDER, [BOB], MESSAGE)
    finally:
        await pool.close()

    assert caught.value.stage == "data" and "354" in str(caught.value)
    assert server.connections == 2  # out of step: not reused


async def test_a_421_to_a_recipient_then_the_close_is_a_throttle_not_an_unknown_outcome(
        servers):
    """The chunk went with the commands, and the server said 421 to the second recipient,
    then closed the connection as a 421 says it will: it took nothing. Read as a lost
    answer, the outcome was unknown, and a template that holds on one waited for an
    operator."""
    server = ChunkingServer(refuse={BOB: b"421 4.3.2 Shutting down"})
    pool = await pool_to(servers, server, throttle_secs=0.05)
    try:
        with pytest.raises(SmtpThrottled) as caught:
            await pool.send(SENDER, [ANN, BOB], MESSAGE)
    finally:
        await pool.close()

    assert not isinstance(caught.value, SmtpAnswerLost)
    assert caught.value.stage == "rcpt" and caught.value.reply.code == 421
    assert caught.value.refused[BOB].code == 421
    assert server.messages == []
