"""One SMTP session of `postrelay inbound`: aiosmtpd's, with what a receiver of bounces
needs on top. The connection cap (421 past it, a place given back once whatever ends the
session), DATA read in bulk (smtpdata.py), BDAT (RFC 3030, chunking.py), replies to
pipelined commands sent in one write (RFC 2920), an idle timer that a slow message does not
trip, and the commands it does not offer (AUTH) or not twice (STARTTLS) refused.

    ReceiverSession(handler, gate=Gate(50), data_size_limit=..., tls_context=..., ...)
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import Any

from aiosmtpd.smtp import MISSING, SMTP, syntax

from postrelay.core.telemetry import event
from postrelay.orchestrator.feedback.chunking import (
    DATA_AFTER_BDAT,
    NEED_RCPT,
    SYNTAX,
    TOO_BIG,
    Chunks,
    parse_bdat,
    read_chunk,
)
from postrelay.orchestrator.feedback.smtpdata import read_data

READ_LIMIT = 64 * 1024  # a session's stream reader: asyncio's default
# `<local@domain>` as every MTA writes MAIL FROM and RCPT TO: a dot-atom local part and a
# host name (or `<>`, the null sender of every bounce), optionally followed by parameters.
PLAIN_PATH = re.compile(
    r"<(?:([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*)"
    r"@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)?>(?=\s|$)")


class ReceiverSession(SMTP):
    """One session; refused at once past the connection cap."""

    # aiosmtpd sizes its stream reader by line_length_limit, and a reader stops reading its
    # socket whenever it holds more than twice that: a DSN of a few kB made it stop and
    # start again (two system calls and two trips through the loop) in every DATA. The
    # reader gets asyncio's usual limit; DATA lines are still held to aiosmtpd's 1001 bytes
    # (read_data) and command lines to its command size limits, with the same replies.
    line_length_limit = READ_LIMIT

    def __init__(self, *args: Any, gate: Gate, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gate = gate
        self._counted = False
        self._refused = False  # turned away at the cap: no session was made
        self._arrived_at = 0.0  # loop time of the last idle-timer restart by data_received
        self._held = bytearray()  # replies waiting for the next one (push)
        self._chunks: Chunks | None = None  # the BDAT chunks of the current transaction

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._counted:  # the same session over TLS: aiosmtpd makes it again after STARTTLS
            super().connection_made(transport)
            return
        if self._gate.open >= self._gate.limit:
            transport.write(b"421 4.7.0 too many connections; try again later\r\n")  # type: ignore[attr-defined]
            transport.close()
            self._refused = True
            return
        self._gate.open += 1
        self._counted = True
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        """aiosmtpd restarts its idle timer at each command only: a message sent slowly (a
        large DSN on a slow link) was cut off that long after its DATA or BDAT. It restarts
        as bytes arrive, at most once a second, as Postfix's smtpd_timeout does per read."""
        super().data_received(data)
        now = self.loop.time()
        if now - self._arrived_at >= 1.0 and self.session is not None:
            self._arrived_at = now
            self._reset_timeout()

    async def push(self, status: str | bytes) -> None:
        """aiosmtpd's push, but a 250 waits while the client's next command is already
        here (RFC 2920: a server may hold the replies to pipelined commands until it runs
        out of input): the replies to a pipelined MAIL, RCPT and DATA leave in one write.
        Every 552 is a message over max_bytes (announced by MAIL's SIZE, or met in DATA or
        BDAT), logged here, where the three meet, for the operator whose cap it is."""
        reply = status.encode("utf-8" if self.enable_SMTPUTF8 else "ascii") \
            if isinstance(status, str) else status
        if reply.startswith(b"552 "):
            peer = self.session.peer if self.session is not None else None
            event("postrelay.inbound.too_big", logging.WARNING, peer=str(peer),
                  max_bytes=self.data_size_limit)
        # The stream reader's buffer holds what the client sent and no command has read.
        self._held += reply + b"\r\n"
        if reply.startswith(b"250 ") and b"\n" in self._reader._buffer:  # type: ignore[attr-defined]
            return
        await self._flush()

    async def _flush(self) -> None:
        """Send the replies held by push."""
        line, self._held = bytes(self._held), bytearray()
        self._writer.write(line)
        await self._writer.drain()

    def connection_lost(self, error: Exception | None) -> None:
        if self._refused:  # aiosmtpd's own would fail on the session it never made
            return
        self._release()
        super().connection_lost(error)

    def _timeout_cb(self) -> None:
        # A session timed out in its STARTTLS handshake ends without connection_lost
        # (Python's TLS layer tells a session nothing before the handshake is done): its
        # place is given back here, or it stayed taken for good.
        self._release()
        super()._timeout_cb()  # type: ignore[no-untyped-call]

    def _release(self) -> None:
        """Give back this connection's place under the cap (once)."""
        if self._counted:
            self._gate.open -= 1
            self._counted = False

    @syntax("AUTH <mechanism>")
    async def smtp_AUTH(self, arg: str) -> None:  # noqa: N802 - aiosmtpd's command name
        """Not offered (handle_EHLO): the receiver takes mail from anyone, for its domain."""
        await self.push("502 5.5.1 AUTH not available")

    @syntax("STARTTLS", when="tls_context")
    async def smtp_STARTTLS(self, arg: str) -> None:  # noqa: N802 - aiosmtpd's command name
        """aiosmtpd's STARTTLS, but not a second time in one session (RFC 3207 4.2), which
        it took and then failed on inside Python's TLS."""
        if self._tls_protocol is not None:
            await self.push("503 5.5.1 TLS already active")
            return
        await super().smtp_STARTTLS(arg)

    @syntax("MAIL FROM: <address>", extended=" [SP <mail-parameters>]")
    async def smtp_MAIL(self, arg: str) -> None:  # noqa: N802 - aiosmtpd's command name
        """aiosmtpd's MAIL. A MAIL taken starts a transaction (RFC 5321 3.3), in the same
        Envelope object aiosmtpd keeps: a BDAT refused before it does not refuse its
        chunks."""
        assert self.envelope is not None
        started = self.envelope.mail_from is None
        await super().smtp_MAIL(arg)
        if started and self.envelope.mail_from is not None:
            self._chunks = None

    @syntax("DATA")
    async def smtp_DATA(self, arg: str) -> None:  # noqa: N802 - aiosmtpd's command name
        """aiosmtpd's DATA, its message read in bulk (`smtpdata`) rather than a line at a
        time; the same replies, limits and handle_DATA hook."""
        if await self.check_helo_needed() or await self.check_auth_needed("DATA"):
            return
        assert self.envelope is not None
        if self._chunking():
            await self.push(DATA_AFTER_BDAT)
            return
        if not self.envelope.rcpt_tos:
            await self.push("503 Error: need RCPT command")
            return
        if arg:
            await self.push("501 Syntax: DATA")
            return
        await self.push("354 End data with <CR><LF>.<CR><LF>")
        try:
            body, error = await read_data(self._reader, max_bytes=self.data_size_limit,
                                          max_line=SMTP.line_length_limit)
        except asyncio.CancelledError:  # the connection was reset during DATA
            self._writer.close()
            raise
        if error is not None:
            await self.push(error)
            self._set_post_data_state()  # type: ignore[no-untyped-call]
            return
        await self._accept(body)

    @syntax("BDAT <size> [LAST]")
    async def smtp_BDAT(self, arg: str) -> None:  # noqa: N802 - aiosmtpd's command name
        """RFC 3030: one chunk of the message (chunking.py); the last one hands the whole
        message to the handle_DATA hook, as DATA does. A chunk is read before any reply,
        refused or not: its bytes are not commands."""
        command = parse_bdat(arg or "")  # aiosmtpd passes None for a bare BDAT
        if command is None:  # the size is unknown, so where the next command starts is too
            await self.push(SYNTAX)
            self._close()
            return
        assert self.envelope is not None
        if self._chunks is None or not self._chunking():
            self._chunks = Chunks(self.envelope)
        chunks = self._chunks
        error = None
        if not self.envelope.rcpt_tos:
            error = NEED_RCPT
        elif self.data_size_limit and len(chunks.kept) + command.size > self.data_size_limit:
            error = TOO_BIG
        if self._held and len(self._reader._buffer) < command.size:  # type: ignore[attr-defined]
            # The chunk is still arriving: the replies held for MAIL and RCPT go now, as
            # RFC 2920 3.2 wants once the input is used up.
            await self._flush()
        try:
            chunk = await read_chunk(self._reader, command.size,
                                     keep=error is None and chunks.error is None)
        except asyncio.IncompleteReadError:  # the client left mid-chunk: nothing to answer
            self._close()
            return
        if await self.check_helo_needed() or await self.check_auth_needed("BDAT"):
            return
        chunks.add(chunk, error)
        if chunks.error is not None:
            if command.last:
                self._set_post_data_state()  # type: ignore[no-untyped-call]
            await self.push(chunks.error)
            return
        if not command.last:
            await self.push(f"250 2.0.0 OK: {command.size} bytes")
            return
        await self._accept(bytes(chunks.kept))

    def _chunking(self) -> bool:
        """Whether the current transaction has had a BDAT chunk."""
        return self._chunks is not None and self._chunks.envelope is self.envelope

    async def _accept(self, body: bytes) -> None:
        """The whole message: to the handle_DATA hook, whose reply ends the transaction."""
        assert self.envelope is not None
        content: str | bytes = body
        if self._decode_data:
            try:
                content = body.decode("utf-8" if self.enable_SMTPUTF8 else "ascii",
                                      "surrogateescape" if self.enable_SMTPUTF8 else "strict")
            except UnicodeDecodeError:  # 8-bit data though SMTPUTF8 is off
                await self.push("500 Error: strict ASCII mode")
                return
        self.envelope.content = content
        self.envelope.original_content = body
        status = await self._call_handler_hook("DATA")
        self._set_post_data_state()  # type: ignore[no-untyped-call]
        await self.push("250 OK" if status is MISSING else status)

    def _close(self) -> None:
        """End the session, as aiosmtpd's QUIT does (the connection may be gone already)."""
        if self._handler_coroutine is not None:
            self._handler_coroutine.cancel()
        if self.transport is not None:
            self.transport.close()

    def _getaddr(self, arg: str) -> tuple[str | None, str | None]:
        # aiosmtpd reads every path with email's full RFC 5322 parser (and defines a class
        # per call); the plain form every MTA writes is read here, anything else by it.
        match = PLAIN_PATH.match(arg)
        rest = arg[match.end():] if match else "("
        if "(" in rest:  # a comment: email's parser knows where it ends
            return super()._getaddr(arg)
        assert match is not None
        local = match.group(1)
        if local is None:  # `<>`, parameters as aiosmtpd leaves them
            return "<>", rest
        if self.local_part_limit and len(local) > self.local_part_limit:
            return None, None
        return match.group(0)[1:-1], rest.lstrip()


@dataclass
class Gate:
    """The connection cap: how many sessions may be open, and how many are."""

    limit: int
    open: int = 0
