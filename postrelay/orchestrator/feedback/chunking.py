"""CHUNKING (RFC 3030) for `postrelay inbound`: a message sent as BDAT chunks instead of
DATA, as Gmail, Microsoft 365 and Exim send mail to a server that offers it.

`BDAT <size> [LAST]` is followed at once by exactly `size` bytes of the message, as they
are (no dot-stuffing, no end line), so a client can pipeline MAIL, RCPT and the whole
message in one write and read the three replies in one: a message costs one round trip
instead of DATA's two (the 354, then the end of data). The chunk's bytes are read even when
the command is refused: what follows them is the client's next command.

    command = parse_bdat(arg)        # None: not `<digits> [LAST]`
    chunk = await read_chunk(reader, command.size, keep=within_limit)
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

from aiosmtpd.smtp import Envelope

SYNTAX = "501 5.5.4 Syntax: BDAT count [LAST]"
NEED_RCPT = "503 5.5.1 Error: need RCPT command"
DATA_AFTER_BDAT = "503 5.5.1 Error: DATA after BDAT in the same transaction"
TOO_BIG = "552 5.3.4 Error: message too big"
_ARG = re.compile(r"(\d{1,10})(?:[ \t]+(LAST))?", re.IGNORECASE)
_PIECE = 64 * 1024  # a chunk read and dropped piece by piece: a refused one is not held


@dataclass(frozen=True)
class Bdat:
    size: int
    last: bool


def parse_bdat(arg: str) -> Bdat | None:
    match = _ARG.fullmatch(arg.strip())
    if match is None:
        return None
    return Bdat(int(match.group(1)), match.group(2) is not None)


@dataclass
class Chunks:
    """The chunks of one mail transaction so far, and the error that refused it, if one
    did: every later chunk of it gets the same reply, and LAST ends it."""

    envelope: Envelope  # the transaction they belong to (RSET or a new MAIL makes another)
    kept: bytearray = field(default_factory=bytearray)
    error: str | None = None

    def add(self, chunk: bytes | None, error: str | None) -> None:
        if self.error is None and error is not None:
            self.error = error
            self.kept = bytearray()  # nothing more is kept of a refused message
        elif self.error is None and chunk is not None:
            self.kept += chunk


async def read_chunk(reader: asyncio.StreamReader, size: int, *, keep: bool) -> bytes | None:
    """The `size` bytes after a BDAT command: returned when `keep`, read and dropped
    otherwise. Raises asyncio.IncompleteReadError when the connection ends first."""
    if keep:
        return await reader.readexactly(size)
    left = size
    while left:
        piece = await reader.read(min(left, _PIECE))
        if not piece:
            raise asyncio.IncompleteReadError(b"", left)
        left -= len(piece)
    return None
