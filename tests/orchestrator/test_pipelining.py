"""SMTP PIPELINING (RFC 2920): what the pool writes, seen by a recording proxy between it and a
real aiosmtpd server, and how a pipelined dialogue stays in step when the server refuses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from aiosmtplib.protocol import PERIOD_REGEX, normalize_message_line_endings
from hypothesis import given, settings
from hypothesis import strategies as st

from postrelay.orchestrator.dialogue import message_data
from postrelay.orchestrator.transport import SmtpPermanent, SmtpThrottled, SmtpTransient
from postrelay.testing import SmtpSink, reply, reply_at_data
from tests.orchestrator.smtp_helpers import SENDER, message

ANN = "ann@acme.example"
BOB = "bob@acme.example"


class RecordingProxy:
    """Forwards loopback TCP to `sink`, keeping each chunk the client wrote, per connection."""

    def __init__(self, sink: SmtpSink) -> None:
        self.sink = sink
        self.host = "127.0.0.1"
        self.port = 0
        self.writes: list[list[bytes]] = []
        self.to_clients: list[asyncio.StreamWriter] = []  # to speak to a client unasked
        self.byte_by_byte = False  # the server's replies reach the client one byte a write
        self.rewrite: Callable[[bytes], bytes] = lambda data: data  # of the server's replies
        self._server: asyncio.Server | None = None

    async def start(self) -> RecordingProxy:
        self._server = await asyncio.start_server(self._relay, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _relay(self, client_in: asyncio.StreamReader,
                     client_out: asyncio.StreamWriter) -> None:
        server_in, server_out = await asyncio.open_connection(self.sink.host, self.sink.port)
        self.to_clients.append(client_out)
        chunks: list[bytes] = []
        self.writes.append(chunks)

        async def from_client() -> None:
            while data := await client_in.read(65536):
                chunks.append(data)
                server_out.write(data)
            server_out.close()

        async def from_server() -> None:
            while data := await server_in.read(65536):
                data = self.rewrite(data)
                pieces = [data[i:i + 1] for i in range(len(data))] if self.byte_by_byte \
                    else [data]
                for piece in pieces:
                    client_out.write(piece)
                    await client_out.drain()
                    if self.byte_by_byte:
                        await asyncio.sleep(0.001)
            client_out.close()

        await asyncio.gather(from_client(), from_server(), return_exceptions=True)

    def commands(self, connection: int = 0) -> list[bytes]:
        """The client's writes on one connection after EHLO, message bodies left out."""
        writes = self.writes[connection]
        after_ehlo = [w for w in writes if not w.startswith((b"EHLO", b"HELO"))]
        return [w for w in after_ehlo if w[:4].isalpha() and w[:4].isupper()]


@pytest.fixture
async def proxied(make_sink) -> AsyncIterator[Callable[..., tuple[SmtpSink, RecordingProxy]]]:
    proxies: list[RecordingProxy] = []

    async def make(rules=None, **options) -> tuple[SmtpSink, RecordingProxy]:
        sink = make_sink(rules, **options)
        proxy = await RecordingProxy(sink).start()
        proxies.append(proxy)
        return sink, proxy

    yield make
    for proxy in proxies:
        await proxy.stop()


def pool_through(make_pool, proxy: RecordingProxy, **overrides):
    return make_pool(proxy, **overrides)  # make_pool reads only host and port


async def test_mail_rcpt_and_data_go_in_one_write_when_pipelining_is_offered(
        proxied, make_pool):
    sink, proxy = await proxied()
    pool = pool_through(make_pool, proxy)

    delivery = await pool.send(SENDER, [ANN, BOB], message())

    assert delivery.accepted == (ANN, BOB)
    assert proxy.commands()[0] == (b"MAIL FROM:<app@postrelay.example>\r\n"
                                   b"RCPT TO:<ann@acme.example>\r\n"
                                   b"RCPT TO:<bob@acme.example>\r\nDATA\r\n")
    assert sink.handler.received[0].recipients == (ANN, BOB)


async def test_without_pipelining_each_command_waits_for_its_reply(proxied, make_pool):
    sink, proxy = await proxied(pipelining=False)
    pool = pool_through(make_pool, proxy)

    await pool.send(SENDER, [ANN, BOB], message())

    assert proxy.commands()[:4] == [b"MAIL FROM:<app@postrelay.example>\r\n",
                                    b"RCPT TO:<ann@acme.example>\r\n",
                                    b"RCPT TO:<bob@acme.example>\r\n", b"DATA\r\n"]
    assert sink.handler.received[0].recipients == (ANN, BOB)


async def test_a_pipelined_partial_refusal_delivers_to_the_rest_on_the_same_connection(
        proxied, make_pool):
    sink, proxy = await proxied({"nobody@*": reply("550 5.1.1 No such user")})
    pool = pool_through(make_pool, proxy)

    first = await pool.send(SENDER, ["nobody@acme.example", ANN], message())
    second = await pool.send(SENDER, [BOB], message())

    assert first.accepted == (ANN,) and first.refused["nobody@acme.example"].code == 550
    assert second.accepted == (BOB,)
    assert [r.recipients for r in sink.handler.received] == [(ANN,), (BOB,)]
    assert sink.connections == 1


async def test_every_recipient_refused_reads_the_data_refusal_and_stays_in_step(
        proxied, make_pool):
    sink, proxy = await proxied({"nobody@*": reply("550 5.1.1 No such user")})
    pool = pool_through(make_pool, proxy)

    with pytest.raises(SmtpPermanent) as caught:
        await pool.send(SENDER, ["nobody@acme.example"], message())
    delivery = await pool.send(SENDER, [ANN], message())

    assert caught.value.stage == "rcpt" and caught.value.reply.code == 550
    assert delivery.accepted == (ANN,) and delivery.reply.code == 250
    # The refused DATA (503: no valid recipients) was read before RSET, on one connection.
    assert b"RSET\r\n" in proxy.commands()
    assert sink.connections == 1 and len(sink.handler.received) == 1


async def test_a_throttle_with_data_already_accepted_abandons_the_message(
        proxied, make_pool):
    """The first RCPT says 421, the second is accepted and DATA gets its 354: the pool backs
    off without sending the message, so it must not reach the second recipient."""
    sink, proxy = await proxied()
    sink.handler.refuse_next("421 4.7.0 Too many messages, slow down")
    pool = pool_through(make_pool, proxy, throttle_secs=0.05)

    with pytest.raises(SmtpThrottled):
        await pool.send(SENDER, [ANN, BOB], message())
    await pool.send(SENDER, [BOB], message(subject="later"))

    assert [r.message["Subject"] for r in sink.handler.received] == ["later"]
    assert pool.connections_opened == 2  # mid-DATA, only closing the connection abandons it


async def test_a_refusal_at_the_end_of_data_leaves_the_connection_usable(proxied, make_pool):
    sink, proxy = await proxied({"ap@blocked.example": reply_at_data("554 5.7.1 Blocked")})
    pool = pool_through(make_pool, proxy)

    with pytest.raises(SmtpPermanent) as caught:
        await pool.send(SENDER, ["ap@blocked.example"], message())
    await pool.send(SENDER, [ANN], message())

    assert caught.value.stage == "data"
    assert sink.connections == 1 and len(sink.handler.received) == 1


async def test_a_reply_nobody_asked_for_retires_the_idle_connection(proxied, make_pool):
    """RFC 5321 lets a server say 421 at any moment; a connection that heard something
    unasked is out of step and is not used again."""
    sink, proxy = await proxied()
    pool = pool_through(make_pool, proxy)
    await pool.send(SENDER, [ANN], message())

    proxy.to_clients[0].write(b"421 4.3.2 shutting down soon\r\n")
    await asyncio.sleep(0.1)
    delivery = await pool.send(SENDER, [BOB], message())

    assert delivery.accepted == (BOB,) and pool.connections_opened == 2
    assert [r.recipients for r in sink.handler.received] == [(ANN,), (BOB,)]
    # Nothing more was written on the first connection after it spoke unasked.
    assert sum(w.startswith(b"MAIL") for w in proxy.commands(0)) == 1


async def test_replies_cut_into_single_bytes_and_a_multiline_reply_are_read_whole(
        proxied, make_pool):
    blocked = "554-5.7.1 Blocked by policy\r\n554 5.7.1 see https://acme.example/why"
    sink, proxy = await proxied({"ap@blocked.example": reply_at_data(blocked)})
    proxy.byte_by_byte = True
    pool = pool_through(make_pool, proxy)

    with pytest.raises(SmtpPermanent) as caught:
        await pool.send(SENDER, ["ap@blocked.example"], message())
    delivery = await pool.send(SENDER, [ANN, BOB], message())

    assert caught.value.reply.text == "Blocked by policy\nsee https://acme.example/why"
    assert delivery.accepted == (ANN, BOB) and delivery.queue_id is not None
    assert sink.connections == 1


async def test_a_garbled_reply_fails_the_send_as_transient_and_drops_the_connection(
        proxied, make_pool):
    sink, proxy = await proxied()
    proxy.rewrite = lambda data: data.replace(b"250 OK\r\n", b"hello there\r\n")
    pool = pool_through(make_pool, proxy)

    with pytest.raises(SmtpTransient) as caught:
        await pool.send(SENDER, [ANN], message())

    assert caught.value.stage == "mail" and "Malformed" in str(caught.value)
    assert pool.messages_sent == 0 and sink.handler.received == []
    proxy.rewrite = lambda data: data
    await pool.send(SENDER, [ANN], message())
    assert pool.connections_opened == 2  # a dialogue out of step is not reused


@given(st.binary(max_size=200) | st.lists(st.sampled_from(
    [b"a", b".", b"..", b"\r", b"\n", b"\r\n", b" ", b"From x"])).map(b"".join))
@settings(max_examples=1000, deadline=None)
def test_message_data_is_the_bytes_aiosmtplib_would_send(message: bytes) -> None:
    """Written here for aiosmtplib before 5.1, which has no such function to share."""
    expected = PERIOD_REGEX.sub(b"..", normalize_message_line_endings(message)) + b".\r\n"
    assert message_data(message) == expected
