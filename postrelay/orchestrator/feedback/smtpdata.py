"""The message of an SMTP DATA command, read in bulk with aiosmtpd's rules.

aiosmtpd reads DATA one line at a time (an `await readuntil` and its bookkeeping per
line: about half of its dialogue's CPU for a DSN of 70 lines). This reads up to each
`.<CR><LF>` it meets (or as much as the stream's limit allows) until one ends a lone dot
line, or, once the lone dot line has arrived, straight up to it; and applies the same
rules to the lines it got, in order:

- a line longer than `max_line` bytes (CRLF included) makes it `500 Line too long`;
- more than `max_bytes` bytes of lines (as sent, dot-stuffing included, the final `.`
  line not) makes it `552 Too much mail data`; whichever of the two comes first in the
  message wins, as in aiosmtpd (which tells a line of more than max_line + 2 bytes at
  once, a shorter one only after counting it);
- the message is kept only while neither happened (at most `max_bytes`), and ends at a
  line that is a lone `.`; a line's leading dot is removed (RFC 5321 4.5.2).

    body, error = await read_data(reader, max_bytes=5 << 20, max_line=1001)
"""

from __future__ import annotations

import asyncio

TOO_LONG = "500 Line too long (see RFC5321 4.5.3.1.6)"
TOO_MUCH = "552 Error: Too much mail data"
_END = b".\r\n"
_CRLF = b"\r\n"
_LONE_DOT = _CRLF + _END  # a lone `.` line, with the line break before it
FEED_BYTES = 64 * 1024


class _Lines:
    """The DATA lines seen so far: what is kept, what was counted, the first error."""

    def __init__(self, max_bytes: int | None, max_line: int) -> None:
        self.max_bytes = max_bytes
        self.max_line = max_line
        self.kept = bytearray()
        self.size = 0
        self.error: str | None = None
        self.current = b""  # the unfinished line (only its tail once it is too long)
        self.carried = 0  # bytes of the unfinished line no longer in `current`

    @property
    def at_line_start(self) -> bool:
        return not self.current and not self.carried

    def feed(self, data: bytes) -> None:
        if self.current:
            data = self.current + data
        parts = data.split(_CRLF)
        rest = parts.pop()
        if parts:
            complete = len(data) - len(rest)
            if (self.error is None and not self.carried
                    and max(map(len, parts)) + 2 <= self.max_line
                    and (not self.max_bytes or self.size + complete <= self.max_bytes)):
                # The usual case: every line of this piece is within the limits.
                self.kept += memoryview(data)[:complete]
                self.size += complete
            else:
                self._one_by_one(parts)
            self.carried = 0
        if len(rest) > self.max_line + 2:  # too long already: keep its length, not it
            self.carried += len(rest) - 1
            rest = rest[-1:]  # a trailing CR may begin the CRLF that ends it
        self.current = rest

    def _one_by_one(self, parts: list[bytes]) -> None:
        for i, part in enumerate(parts):
            length = len(part) + 2 + (self.carried if i == 0 else 0)
            if self.error is not None:
                continue
            if length > self.max_line + 2:  # aiosmtpd's stream limit: told before counting
                self._fail(TOO_LONG)
                continue
            self.size += length
            if self.max_bytes and self.size > self.max_bytes:
                self._fail(TOO_MUCH)
            elif length > self.max_line:
                self._fail(TOO_LONG)
            else:
                self.kept += part + _CRLF

    def _fail(self, error: str) -> None:
        self.error = error
        self.kept = bytearray()  # nothing more is kept: no memory for what is refused

    def content(self) -> bytes:
        """The message without its dot-stuffing."""
        body = bytes(self.kept)
        if body.startswith(b"."):
            body = body[1:]
        return body.replace(b"\r\n.", _CRLF)


async def read_data(reader: asyncio.StreamReader, *, max_bytes: int | None,
                    max_line: int) -> tuple[bytes, str | None]:
    """The message up to its lone `.` line, and the error reply (then the message is
    empty) when it broke a limit; the whole of it is read in any case."""
    lines = _Lines(max_bytes, max_line)
    # What was read and not yet checked: checked once at the end, not at each line that
    # ends in a dot (most sentences of a bounce do), and in slices before that, so a message
    # refused for its size is not held whole. A slice leaves its last two bytes here: the
    # line end a lone dot must follow.
    pending = bytearray()
    fed = False
    while True:
        try:
            pending += await reader.readuntil(_END)
        except asyncio.LimitOverrunError as exc:  # no `.` CRLF within the stream's limit
            pending += await reader.read(exc.consumed)
        else:
            if pending.endswith(_LONE_DOT) or (not fed and pending == _END):
                break
            # At a line start, the rest of the message has most likely arrived already:
            # it is taken up to its end in one read, not in one read per line ending in
            # a dot (most sentences of a bounce do).
            if end := _buffered_end(reader):
                pending += await reader.readexactly(end)
                break
        if len(pending) >= FEED_BYTES:
            lines.feed(bytes(pending[:-2]))
            del pending[:-2]
            fed = True
    del pending[-len(_END):]
    lines.feed(bytes(pending))
    if lines.error is not None:
        return b"", lines.error
    return lines.content(), None


def _buffered_end(reader: asyncio.StreamReader) -> int:
    """At a line start: how many of the bytes the reader holds (received, not yet read) go
    up to and through the lone `.` line, 0 if it has not arrived. The reader's buffer is
    asyncio's own attribute, read as `ReceiverSession.push` (session.py) reads it; only
    what is there is taken, so a message that arrives later is read as before."""
    buffered = reader._buffer  # type: ignore[attr-defined]
    if buffered.startswith(_END):
        return len(_END)
    at = buffered.find(_LONE_DOT)
    return at + len(_LONE_DOT) if at >= 0 else 0
