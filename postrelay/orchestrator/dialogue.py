"""The mail transaction on an open SMTP connection: commands out, replies back in order,
pipelined (RFC 2920) when the server offers PIPELINING.

    dialogue = Dialogue.take_over(smtp, timeout_secs=30.0)   # after connect, EHLO, TLS, AUTH
    dialogue.write(b"MAIL FROM:<a@x.example>", b"RCPT TO:<b@y.example>", b"DATA")
    mail, rcpt, data = [await dialogue.read() for _ in range(3)]
    dialogue.write_message(raw)          # after a 354
    final = await dialogue.read()

When the server offers CHUNKING (RFC 3030) too, `write_chunked` sends the commands and the
whole message as one `BDAT <size> LAST` in one write: one round trip for the message.

aiosmtplib opens the connection and says EHLO, STARTTLS and AUTH; then its transport is
handed to a `Dialogue` for every message sent on it. aiosmtplib reads one reply per command
written and drops replies that arrive ahead of their read, so it cannot send MAIL, RCPT and
DATA in one write: with it a message costs a write and a wait per command. The `Dialogue`
keeps every reply in order, and knows which commands still owe one, so that after an error
`reset` can bring the connection back in step (or say it cannot).
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from typing import cast

import aiosmtplib
from aiosmtplib import SMTPResponse
from aiosmtplib.email import quote_address

# An envelope address that aiosmtplib's own quoting (email.utils.parseaddr, then a check
# for characters that could smuggle in a parameter) would send as `<address>` unchanged:
# a dot-atom local part of the usual characters and a domain of LDH labels.
PLAIN_ADDRESS = re.compile(
    r"[A-Za-z0-9_+=-]+(?:\.[A-Za-z0-9_+=-]+)*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*")
_LINE_ENDINGS = re.compile(rb"\r\n|\n|\r(?!\n)")
_LEADING_DOT = re.compile(rb"(?m)^\.")
_MAX_REPLY_BYTES = 64 * 1024  # a reply longer than this is not SMTP
_SHOWN = 300  # of a garbled reply, the bytes its error quotes


def envelope_address(address: str, *, utf8: bool) -> bytes:
    """`<address>` as MAIL FROM and RCPT TO carry it, quoted as aiosmtplib quotes it."""
    quoted = f"<{address}>" if PLAIN_ADDRESS.fullmatch(address) else quote_address(address)
    return quoted.encode("utf-8" if utf8 else "ascii")


def announced_size(value: str | None) -> int | None:
    """The largest message a server takes, from its `SIZE` keyword's value; None when it
    names none (no value, 0, or one that is not a number)."""
    size = (value or "").strip()
    return int(size) if size.isdigit() and int(size) > 0 else None


def message_lines(message: bytes) -> bytes:
    """The message with CRLF line endings, ending with one: what BDAT sends."""
    # Most messages come with CRLF line ends: counting in C is cheaper than a substitution
    # that rewrites every line end as itself.
    crlf = message.count(b"\r\n")
    if message.count(b"\n") == crlf == message.count(b"\r"):
        data = message
    else:
        data = _LINE_ENDINGS.sub(b"\r\n", message)
    return data if data.endswith(b"\r\n") else data + b"\r\n"


def message_data(message: bytes) -> bytes:
    """The message as DATA sends it: CRLF line endings, leading dots doubled, the final dot;
    the bytes aiosmtplib sends (its own helper exists only from 5.1 on; a test holds the
    two together)."""
    data = message_lines(message)
    if data.startswith(b".") or b"\n." in data:
        data = _LEADING_DOT.sub(b"..", data)
    return data + b".\r\n"


class Dialogue(asyncio.Protocol):
    """The commands and replies of one SMTP connection, after its setup."""

    def __init__(self, transport: asyncio.Transport, *, pipelining: bool, smtputf8: bool,
                 timeout_secs: float, chunking: bool = False, eightbitmime: bool = True,
                 max_size: int | None = None) -> None:
        self.pipelining = pipelining
        self.chunking = chunking
        self.smtputf8 = smtputf8
        self.eightbitmime = eightbitmime
        self.max_size = max_size  # the SIZE the server announced (RFC 1870); None: no limit
        self._transport = transport
        self._timeout = timeout_secs
        self._buffer = bytearray()
        self._replies: deque[SMTPResponse] = deque()
        self._owed: deque[bytes] = deque()  # the commands not yet answered, in order
        self._in_data = False  # a 354 was read and the message not sent
        # The message went (after DATA's 354, or as a BDAT chunk) and its final reply is
        # not read yet: lost now, the server may have taken it.
        self.message_pending = False
        self._lost: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None

    @classmethod
    def take_over(cls, smtp: aiosmtplib.SMTP, *, timeout_secs: float,
                  chunking: bool = True) -> Dialogue:
        """Take the connection of `smtp`, which is set up and idle; `smtp` is done with.
        `chunking=False`: never BDAT, even where the server offers it. After HELO (a server
        that does not know EHLO) the server offers no extension, and none is used."""
        transport = cast("asyncio.Transport | None", smtp.transport)
        if transport is None or transport.is_closing():
            raise aiosmtplib.SMTPServerDisconnected("Connection lost")
        pipelining = smtp.supports_extension("pipelining")
        dialogue = cls(transport, pipelining=pipelining,
                       smtputf8=smtp.supports_extension("smtputf8"), timeout_secs=timeout_secs,
                       chunking=chunking and pipelining and smtp.supports_extension("chunking"),
                       eightbitmime=smtp.supports_extension("8bitmime"),
                       max_size=announced_size(smtp.esmtp_extensions.get("size")))
        transport.set_protocol(dialogue)
        return dialogue

    @property
    def is_connected(self) -> bool:
        return self._lost is None and not self._transport.is_closing()

    @property
    def is_idle(self) -> bool:
        """Connected and in step: nothing owed and nothing said unasked (a server may send
        421 at any moment before it closes), so the next reply answers the next command."""
        return self.is_connected and not self._owed and not self._replies

    # A write on a connection already lost sends nothing, and raises nothing: the loss is
    # what the read of its reply reports, at the stage of the command that was not sent.

    def write(self, *commands: bytes) -> None:
        """Send `commands` (without their CRLF) in one write; each owes a reply."""
        self._send(b"".join(c + b"\r\n" for c in commands))
        self._owed.extend(commands)

    def write_message(self, message: bytes) -> None:
        """Send the message after DATA's 354; it owes the final reply."""
        if not self._in_data:
            raise RuntimeError("the message goes only after a 354 reply to DATA")
        self._in_data = False
        self._owed.append(b".")
        # Pending only once it went: a message never written cannot have been accepted.
        self.message_pending = self._send(message_data(message))

    def write_chunked(self, *commands: bytes, message: bytes) -> None:
        """Send `commands` and then the whole message as one `BDAT <size> LAST` chunk
        (RFC 3030), in one write; each command and the chunk owe a reply."""
        data = message_lines(message)
        self._owed.extend(commands)
        self._owed.append(b"BDAT")
        self.message_pending = self._send(b"".join(c + b"\r\n" for c in commands)
                                          + b"BDAT %d LAST\r\n" % len(data) + data)

    async def read(self) -> SMTPResponse:
        """The reply to the oldest command that owes one; raises aiosmtplib's
        SMTPServerDisconnected or SMTPReadTimeoutError (the connection is then closed)."""
        if not self._owed:
            raise RuntimeError("no command is waiting for a reply")
        if not self._replies:
            await self._wait_for_reply()
        response = self._replies.popleft()
        command = self._owed.popleft()
        self._in_data = command == b"DATA" and response.code == 354
        if command in (b".", b"BDAT"):
            self.message_pending = False
        return response

    async def reset(self) -> bool:
        """After an error: read what is still owed, then RSET. False: the connection cannot
        be used again (lost, timed out, or DATA was accepted for a message not to be sent,
        which only closing the connection abandons) and is closed."""
        try:
            while self._owed and not self._in_data:
                await self.read()
            if not self._in_data:
                self.write(b"RSET")
                if (await self.read()).code == 250:
                    return True
        except (aiosmtplib.SMTPException, OSError):
            pass
        self.close()
        return False

    async def quit(self) -> None:
        """QUIT if the dialogue is in step, then close."""
        try:
            if self.is_connected and not self._owed and not self._in_data:
                self.write(b"QUIT")
                await self.read()
        except (aiosmtplib.SMTPException, OSError):
            pass
        finally:
            self.close()

    def close(self) -> None:
        if not self._transport.is_closing():
            self._transport.close()

    # asyncio.Protocol

    def data_received(self, data: bytes) -> None:
        self._buffer.extend(data)
        try:
            while (response := self._parse_reply()) is not None:
                self._replies.append(response)
        except aiosmtplib.SMTPResponseException as exc:
            self._lose(exc)
            self.close()
        if len(self._buffer) > _MAX_REPLY_BYTES:
            self._lose(aiosmtplib.SMTPResponseException(-1, "Response too long"))
            self.close()
        self._wake()

    def eof_received(self) -> bool:
        self._lose(aiosmtplib.SMTPServerDisconnected("Unexpected EOF received"))
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._lose(aiosmtplib.SMTPServerDisconnected(
            f"Connection lost: {exc}" if exc else "Connection lost"))

    # internals

    def _send(self, data: bytes) -> bool:
        """Write `data`; False, writing nothing, when the connection is lost (or closed)."""
        if not self.is_connected:
            self._lose(aiosmtplib.SMTPServerDisconnected("Connection lost"))
            return False
        self._transport.write(data)
        return True

    async def _wait_for_reply(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._replies:
            if self._lost is not None:
                raise self._lost
            self._waiter = waiter = loop.create_future()
            # A timer of our own rather than asyncio.wait_for, which wraps every wait in
            # more futures and callbacks: twice per message on a busy worker.
            timer = loop.call_later(self._timeout, self._time_out, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None

    def _time_out(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_exception(aiosmtplib.SMTPReadTimeoutError(
                "Timed out waiting for server response"))
            self.close()  # out of step for good: a late reply would answer the wrong read

    def _parse_reply(self) -> SMTPResponse | None:
        """One complete reply off the front of the buffer (its lines joined), or None."""
        end = self._buffer.find(b"\n")
        if end == -1:
            return None
        line = bytes(self._buffer[:end + 1])
        if not line[:3].isdigit() or line[3:4] not in (b" ", b"-", b"\r", b"\n"):
            raise _malformed(line)
        if line[3:4] == b"-":
            return self._parse_multiline()
        del self._buffer[:end + 1]
        text = line[4:].strip(b" \t\r\n").decode("utf-8", "surrogateescape")
        return SMTPResponse(int(line[:3]), text)

    def _parse_multiline(self) -> SMTPResponse | None:
        """A reply of several lines, read with the code of its last, or None while it is
        not all in. RFC 5321 4.2.1 gives each line the same code: lines whose codes are of
        different classes (`250-Ok` then `554 Rejected`) say yes and no at once, and such a
        reply is garbled, not taken for either."""
        start, lines, classes = 0, [], set()
        while (end := self._buffer.find(b"\n", start)) != -1:
            line = bytes(self._buffer[start:end + 1])
            start = end + 1
            if not line[:3].isdigit() or line[3:4] not in (b" ", b"-", b"\r", b"\n"):
                raise _malformed(line)
            lines.append(line[4:].strip(b" \t\r\n"))
            classes.add(line[:1])
            if line[3:4] != b"-":
                if len(classes) > 1:
                    raise aiosmtplib.SMTPResponseException(
                        -1, "Malformed SMTP response: its lines' codes disagree: "
                        f"{bytes(self._buffer[:min(start, _SHOWN)])!r}")
                del self._buffer[:start]
                text = b"\n".join(lines).decode("utf-8", "surrogateescape")
                return SMTPResponse(int(line[:3]), text)
        return None

    def _lose(self, exc: Exception) -> None:
        if self._lost is None:
            self._lost = exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def _malformed(line: bytes) -> aiosmtplib.SMTPResponseException:
    return aiosmtplib.SMTPResponseException(
        -1, f"Malformed SMTP response line: {line[:_SHOWN]!r}")
