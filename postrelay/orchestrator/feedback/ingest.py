"""Feed mail to the feedback parser without a listener: single RFC 822 messages, mbox
files and Maildir folders (what a Postfix `pipe` transport or an IMAP fetcher hands over).

    for name, raw in messages(["bounces.mbox", "Maildir/", "-"]):
        ...
"""

from __future__ import annotations

import mailbox
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from sqlalchemy import Engine

from postrelay.core.errors import ValidationError
from postrelay.orchestrator.feedback.mailto import mailto_unsubscribe
from postrelay.orchestrator.feedback.model import Feedback, Recorded, SuppressionPolicy
from postrelay.orchestrator.feedback.parse import parse_mail
from postrelay.orchestrator.feedback.record import record_many
from postrelay.orchestrator.feedback.unsubscribe import UnsubscribeLinks
from postrelay.orchestrator.feedback.verp import ReturnPath


def messages(paths: Sequence[str]) -> Iterator[tuple[str, bytes]]:
    """(name, raw bytes) of each message in `paths`; `-` reads stdin (one message, or an
    mbox when it starts with a `From ` line). A missing path is refused before any is read."""
    for given in paths:
        if given != "-" and not Path(given).exists():
            raise ValidationError("FILE", f"{given} does not exist")
    for given in paths:
        if given == "-":
            yield from _split("stdin", sys.stdin.buffer.read())
            continue
        path = Path(given)
        if path.is_dir():
            if not all((path / sub).is_dir() for sub in ("cur", "new", "tmp")):
                raise ValidationError("FILE", f"{given} is a folder but not a Maildir "
                                              "(cur, new and tmp inside)")
            box = mailbox.Maildir(str(path), factory=None, create=False)
            for key in sorted(box.keys()):
                yield f"{given}:{key}", box.get_bytes(key)
        else:
            yield from _split(given, path.read_bytes())


def _split(name: str, raw: bytes) -> Iterator[tuple[str, bytes]]:
    if not raw.startswith(b"From "):
        yield name, raw
        return
    # An mbox: mailbox.mbox reads from a path, so split on the From_ lines it would.
    chunks = raw.split(b"\nFrom ")
    for i, chunk in enumerate(chunks):
        body = chunk if i == 0 else b"From " + chunk
        body = body.split(b"\n", 1)[1] if b"\n" in body else b""
        # mboxrd: ">From " at a line start was a "From " of the message.
        body = body.replace(b"\n>From ", b"\nFrom ")
        yield f"{name}#{i + 1}", body


def ingest(engine: Engine, raw: bytes, *, envelope_to: Sequence[str] = (),
           return_path: ReturnPath | None, policy: SuppressionPolicy,
           max_bytes: int | None = None,
           unsubscribe: UnsubscribeLinks | None = None) -> list[Recorded]:
    """Parse one message and record each report it holds, in one transaction."""
    reports = read_mail(raw, envelope_to=envelope_to, return_path=return_path,
                        max_bytes=max_bytes, unsubscribe=unsubscribe)
    with engine.begin() as conn:
        return record_many(conn, reports, policy)


def read_mail(raw: bytes, *, envelope_to: Sequence[str] = (),
              return_path: ReturnPath | None, max_bytes: int | None = None,
              unsubscribe: UnsubscribeLinks | None = None) -> list[Feedback]:
    """The reports one message holds: a `mailto:` unsubscribe, else what parse_mail reads."""
    if max_bytes is None or len(raw) <= max_bytes:
        found = mailto_unsubscribe(raw, envelope_to, unsubscribe)
        if found is not None:
            return [found]
    return parse_mail(raw, envelope_to=envelope_to, return_path=return_path,
                      max_bytes=max_bytes)
