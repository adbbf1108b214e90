"""The receiver reads DATA in bulk; it must answer and keep exactly what aiosmtpd's own line
by line DATA does. Each case goes, byte for byte and split the same way across TCP writes,
to aiosmtpd's SMTP and to the receiver's session class, both real listeners on loopback."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from postrelay.orchestrator.feedback.session import Gate, ReceiverSession

CAP = 4000


class Capture:
    def __init__(self) -> None:
        self.messages: list[tuple[bytes | None, str | bytes | None]] = []

    async def handle_DATA(  # noqa: N802 - aiosmtpd's hook name
            self, server: SMTP, session: Session, envelope: Envelope) -> str:
        self.messages.append((envelope.original_content, envelope.content))
        return "250 2.0.0 kept"


class _Listener(Controller):
    def __init__(self, ours: bool, **kwargs: Any) -> None:
        self.ours, self.kwargs, self.capture = ours, kwargs, Capture()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        super().__init__(self.capture, hostname="127.0.0.1", port=port)

    def factory(self) -> SMTP:
        if self.ours:
            return ReceiverSession(self.handler, gate=Gate(10), data_size_limit=CAP, **self.kwargs)
        return SMTP(self.handler, data_size_limit=CAP, **self.kwargs)


def _started(ours: bool, **kwargs: Any) -> _Listener:
    """A listening _Listener; another socket may take the probed port before the bind."""
    for attempt in range(3):
        listener = _Listener(ours, **kwargs)
        try:
            listener.start()
        except OSError:
            if attempt == 2:
                raise
            continue
        return listener
    raise AssertionError("unreachable")


@pytest.fixture(params=[{}, {"decode_data": True}, {"decode_data": True,
                                                    "enable_SMTPUTF8": True}],
                ids=["bytes", "ascii", "utf8"])
def listeners(request: pytest.FixtureRequest) -> Iterator[tuple[_Listener, _Listener]]:
    theirs = _started(False, **request.param)
    try:
        ours = _started(True, **request.param)
        try:
            yield theirs, ours
        finally:
            ours.stop()
    finally:
        theirs.stop()


async def _reply(reader: asyncio.StreamReader) -> bytes:
    """A reply's last line."""
    while True:
        line = await reader.readline()
        if line[3:4] != b"-":
            return line


async def _session(port: int, messages: list[list[bytes]]) -> list[bytes]:
    """Sends each message (its DATA in the pieces given, each its own TCP write) on one
    connection; every reply line from DATA on."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.transport.get_extra_info("socket").setsockopt(  # type: ignore[union-attr]
        socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    await _reply(reader)
    writer.write(b"EHLO client.example\r\n")
    await _reply(reader)
    replies = []
    for pieces in messages:
        for command in (b"MAIL FROM:<>\r\n", b"RCPT TO:<a@b.example>\r\n"):
            writer.write(command)
            await _reply(reader)
        writer.write(b"DATA\r\n")
        replies.append(await _reply(reader))
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.002)  # a write of its own
        replies.append(await _reply(reader))
    writer.write(b"QUIT\r\n")
    await _reply(reader)
    writer.close()
    return replies


def _line(n: int) -> bytes:
    return b"x" * (n - 2) + b"\r\n"


CASES = {
    "empty": [b".\r\n"],
    "plain": [b"Subject: hi\r\n\r\nbody\r\n.\r\n"],
    "dot-stuffed": [b"..first\r\nSubject: x\r\n\r\n..one\r\n.two\r\nthree.\r\n..\r\n"
                    b"...\r\n. \r\nend.\r\n.\r\n"],
    "stuffed lone dot first": [b"..\r\n.\r\n"],
    "8-bit": [b"Subject: caf\xc3\xa9\r\n\r\n\xff\xfe raw\r\n.\r\n"],
    "bare CR and LF": [b"a\rb\nc\r\n.\n\r\n..\r\r\n.\r\n"],
    "split at the terminator": [b"a\r\n", b".", b"\r", b"\n"],
    "split inside CRLF": [b"a\r", b"\n.\r", b"\n"],
    "split after a line-end dot": [b"a.", b"\r\n.\r\n"],
    # Read past a line that ends in a dot, up to the end that has already arrived.
    "sentences": [b"One.\r\nTwo.\r\n\r\nThree\r\n.\r\n"],
    "end right after a line-end dot": [b"a.\r\n.\r\n"],
    "stuffed dot after a line-end dot": [b"a.\r\n..\r\n...b.\r\n..\r\n.\r\n"],
    "end arrives after a line-end dot": [b"One.\r\nTwo\r\n", b"x\r\n.\r\n"],
    "lone dot arrives after a line-end dot": [b"One.\r\nTwo.\r\n", b".\r\n"],
    "bare LF before a dot line": [b"a.\r\nb\n.\r\nc\r\n.\r\n"],
    "over the cap after a line-end dot": [b"a.\r\n" + _line(1000) * 4 + b".\r\n"],
    "too long a line after a line-end dot": [b"a.\r\n" + _line(1003) + b"b\r\n.\r\n"],
    "byte by byte": [bytes([c]) for c in b"S: 1\r\n\r\n..x\r\ny.\r\n.\r\n"],
    "many lines": [b"".join(_line(70) for _ in range(50)) + b".\r\n"],
    "at the cap": [_line(1000) * 4 + b".\r\n"],
    "over the cap": [_line(1000) * 4 + _line(3) + b".\r\n"],
    "far over the cap": [_line(900) * 60, b".\r\n"],
    "line of 1001": [_line(1001) + b".\r\n"],
    "line of 1002": [_line(1002) + b".\r\n"],
    "line of 1003": [_line(1003) + b".\r\n"],
    "line of 1004": [_line(1004) + b".\r\n"],
    "long line in pieces": [b"y" * 700, b"y" * 700, b"y" * 700 + b"\r\n.\r\n"],
    "long line ending in a dot": [b"z" * 1500 + b"\r\n", b"z" * 1500 + b".\r\n.\r\n"],
    "1002 crossing the cap": [_line(1000) * 3 + _line(1002) + b".\r\n"],
    "1004 crossing the cap": [_line(1000) * 3 + _line(1004) + b".\r\n"],
    "long line after the cap": [_line(1000) * 4 + _line(10) + _line(2000) + b".\r\n"],
    "a 200 kB line": [b"w" * 65536] * 3 + [b"w" * 8192 + b"\r", b"\n.\r\n"],
    "CR ending a long line's piece": [b"v" * 1500 + b"\r", b"\n", _line(5) + b".\r\n"],
}


@pytest.mark.parametrize("name", list(CASES))
async def test_data_is_read_as_aiosmtpd_reads_it(listeners, name):
    theirs, ours = listeners
    # Then a plain message on the same connection: the session is back where it was.
    messages = [CASES[name], [b"Subject: next\r\n\r\n.\r\n"]]
    expected = await _session(theirs.port, messages)
    assert await _session(ours.port, messages) == expected
    assert ours.capture.messages == theirs.capture.messages


async def _commands(port: int, lines: list[bytes]) -> list[bytes]:
    """Each command line on one connection, then a plain message: every reply."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await _reply(reader)
    replies = []
    for line in [b"EHLO client.example\r\n", *lines, b"MAIL FROM:<>\r\n",
                 b"RCPT TO:<a@b.example>\r\n", b"DATA\r\n", b"Subject: after\r\n\r\n.\r\n"]:
        writer.write(line)
        replies.append(await _reply(reader))
    writer.close()
    return replies


async def test_long_command_lines_get_aiosmtpds_replies(listeners):
    # The session's stream reader holds more than aiosmtpd's (whose limit is its line
    # length); what a command line too long is told must not change with it.
    theirs, ours = listeners
    lines = [b"NOOP " + b"n" * size + b"\r\n" for size in (500, 1000, 1500, 3000, 70000)]
    lines.append(b"MAIL FROM:<" + b"m" * 2000 + b"@x.example>\r\n")
    expected = await _commands(theirs.port, lines)
    assert await _commands(ours.port, lines) == expected
    assert expected[-1].startswith(b"250")


async def _pipelined_after_data(port: int, data: bytes) -> list[bytes]:
    """One message whose DATA ends in the same write as the commands after it (RFC 2920
    lets a client send them without waiting for the 250): every reply, up to QUIT's."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await _reply(reader)
    replies = []
    for line in [b"EHLO client.example\r\n", b"MAIL FROM:<>\r\n", b"RCPT TO:<a@b.example>\r\n",
                 b"DATA\r\n"]:
        writer.write(line)
        replies.append(await _reply(reader))
    writer.write(data + b"QUIT\r\n")
    while not replies[-1].startswith(b"221"):
        replies.append(await _reply(reader))
    writer.close()
    return replies


async def test_commands_pipelined_after_the_message_are_not_read_as_data(listeners):
    # The message ends with a lone dot right after a line ending in a dot, and what
    # follows it in the same write holds a lone dot line of its own.
    theirs, ours = listeners
    data = b"a.\r\n.\r\nNOOP\r\nNOOP\r\n.\r\n"
    # Bounded: a receiver that took QUIT for data would never answer it.
    expected = await asyncio.wait_for(_pipelined_after_data(theirs.port, data), 10)
    assert await asyncio.wait_for(_pipelined_after_data(ours.port, data), 10) == expected
    assert ours.capture.messages == theirs.capture.messages
    assert [m for m, _ in ours.capture.messages] == [b"a.\r\n"]
