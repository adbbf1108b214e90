"""A message read only in part: `postrelay feedback ingest -` keeps the head of stdin past
POSTRELAY_INBOUND_MAX_BYTES and reads the rest through, holding none of it, for the size
and the digest the parser's `unparsed` report names it by.

    head, cut = read_bounded(sys.stdin.buffer, max_bytes)   # cut None: head is all of it
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import BinaryIO

HEAD_BYTES = 64 * 1024  # what the parser reads a message past the bound's headers from
_PIECE = 1 << 20


@dataclass(frozen=True, slots=True)
class Cut:
    """How large the whole message was, and its digest (parse._digest of all of it)."""

    size: int
    digest: str


def read_bounded(stream: BinaryIO, max_bytes: int) -> tuple[bytes, Cut | None]:
    """All of `stream` when it holds at most `max_bytes`; else its first HEAD_BYTES and the
    Cut of the whole, read to the end (a pipe transport wants its input taken) in pieces."""
    kept = stream.read(max_bytes + 1)
    if len(kept) <= max_bytes:
        return kept, None
    digest, size = StreamDigest(), len(kept)
    for at in range(0, len(kept), _PIECE):
        digest.update(kept[at:at + _PIECE])
    head = kept[:HEAD_BYTES]
    del kept
    while piece := stream.read(_PIECE):
        digest.update(piece)
        size += len(piece)
    return head, Cut(size, digest.hexdigest())


class StreamDigest:
    """parse._digest of bytes fed in pieces: sha256 with CRLF read as LF and the newlines
    that end the message left out. A CR at a piece's end waits for the next piece (it may
    start a CRLF), and so do newlines (they may be the last)."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._cr = b""
        self._newlines = 0

    def update(self, piece: bytes) -> None:
        data = self._cr + piece
        self._cr = b"\r" if data.endswith(b"\r") else b""
        data = data[:len(data) - len(self._cr)].replace(b"\r\n", b"\n")
        text = data.rstrip(b"\n")
        if text:
            self._newlines_out()
            self._hash.update(text)
        self._newlines += len(data) - len(text)

    def hexdigest(self) -> str:
        """The digest of all fed; call once, at the end."""
        if self._cr:  # a CR that ends the message is part of it
            self._newlines_out()
            self._hash.update(self._cr)
        return self._hash.hexdigest()

    def _newlines_out(self) -> None:
        while self._newlines:
            run = min(self._newlines, _PIECE)
            self._hash.update(b"\n" * run)
            self._newlines -= run
