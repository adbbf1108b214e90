"""Feed mail to the feedback parser without a listener: single RFC 822 messages, mbox
files and Maildir folders (what a Postfix `pipe` transport or an IMAP fetcher hands over).

    for mail in messages(["bounces.mbox", "Maildir/", "-"], unseen_only=True):
        ingest(engine, mail.raw, ...)
        if mail.maildir_file is not None:
            mark_seen(mail.maildir_file)
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import stat
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine

from postrelay.core.conflicts import in_transaction
from postrelay.core.errors import ValidationError
from postrelay.orchestrator.feedback.cut import Cut, read_bounded
from postrelay.orchestrator.feedback.mailto import mailto_unsubscribe
from postrelay.orchestrator.feedback.model import Feedback, Recorded, SuppressionPolicy
from postrelay.orchestrator.feedback.parse import parse_mail
from postrelay.orchestrator.feedback.record import record_many
from postrelay.orchestrator.feedback.unsubscribe import UnsubscribeLinks
from postrelay.orchestrator.feedback.verp import ReturnPath

# An mbox's From_ line: "From ", the envelope sender, then a date as asctime writes it. A
# line of a message that only starts with "From " separates nothing: an MTA's pipe (Exim's
# by default, Postfix's with flag F) writes a From_ line and quotes none of the message's.
FROM_LINE = re.compile(rb"^From \S*[ \t]+(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) +"
                       rb"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +\d{1,2} +"
                       rb"\d{1,2}:\d\d", re.MULTILINE)
HEADER_LINE = re.compile(rb"[\041-\071\073-\176]+:")  # a field's name and colon


@dataclass(frozen=True)
class Incoming:
    """One message to ingest: a name for the output, its bytes, and its file when it is
    read from a Maildir with `unseen_only` (to be marked seen once recorded)."""

    name: str
    raw: bytes
    maildir_file: Path | None = None
    cut: Cut | None = None  # stdin past max_bytes: `raw` is its head (cut.py)


def messages(paths: Sequence[str], *, unseen_only: bool = False,
             max_bytes: int | None = None) -> Iterator[Incoming]:
    """Each message in `paths`; `-` reads stdin (one message, or an mbox when it starts with
    a From_ line). With `unseen_only`, a Maildir gives only its messages not flagged seen.
    Stdin past `max_bytes` is one message whose head alone is kept, as the receiver keeps
    no more than that of a message either (an mbox that large is read as a file).
    A path that is missing or not readable, a folder that is not a Maildir, and `-` given
    twice or with stdin closed are refused before any is read."""
    if paths.count("-") > 1:  # the second would read nothing, and say "empty"
        raise ValidationError("FILE", "- (stdin) given more than once: stdin is read once")
    for given in paths:
        path = Path(given)
        if given == "-" and sys.stdin is None:  # started with its stdin closed (`<&-`)
            raise ValidationError("FILE", "- (stdin) given, but stdin is closed")
        if given != "-":
            _check_path(given, path)
        if path.is_dir() and not all((path / sub).is_dir() for sub in ("cur", "new", "tmp")):
            raise ValidationError("FILE", f"{given} is a folder but not a Maildir "
                                          "(cur, new and tmp inside)")
        if path.is_dir():  # the folders its messages are listed from (and moved between)
            for sub in ("new", "cur"):
                _check_path(os.path.join(given, sub), path / sub, write=unseen_only)
    for given in paths:
        if given == "-":
            if max_bytes is None:
                yield from _split("stdin", sys.stdin.buffer.read())
                continue
            raw, cut = read_bounded(sys.stdin.buffer, max_bytes)
            yield from _split("stdin", raw) if cut is None else [Incoming("stdin", raw, cut=cut)]
            continue
        path = Path(given)
        if path.is_dir():
            yield from _maildir(given, path, unseen_only)
        else:
            yield from _split(given, path.read_bytes())


def _check_path(given: str, path: Path, *, write: bool = False) -> None:
    """ValidationError naming `given` and why it cannot be read: missing, a path the system
    cannot follow (a symbolic link loop, a folder it may not enter; Path.exists() said
    "does not exist" for all of them), or one this user may not read (with `write`, nor
    change). Checked with the others, so that such a path stops the run before the files
    ahead of it are recorded rather than after."""
    try:
        is_dir = stat.S_ISDIR(path.stat().st_mode)
    except FileNotFoundError:
        raise ValidationError("FILE", f"{given} does not exist") from None
    except OSError as exc:
        raise ValidationError("FILE", f"{given}: {exc.strerror or exc}") from None
    if not os.access(path, os.R_OK | (os.X_OK if is_dir else 0)):
        raise ValidationError("FILE", f"{given}: permission denied (not readable by this "
                                      "user)")
    if write and not os.access(path, os.W_OK):  # --mark-seen moves each message recorded
        raise ValidationError("FILE", f"{given}: permission denied (--mark-seen moves the "
                                      "messages it records, and this user may not)")


def _maildir(given: str, path: Path, unseen_only: bool) -> Iterator[Incoming]:
    # Listed by hand: Python 3.11's mailbox.Maildir tells a message's flags only by parsing
    # it, and sets them only by writing the message anew.
    files = [Path(entry.path) for sub in ("new", "cur") for entry in os.scandir(path / sub)
             if not entry.name.startswith(".") and entry.is_file()
             and not (unseen_only and "S" in _flags(entry.name))]
    for file in sorted(files, key=lambda f: _unique_name(f.name)):
        try:
            raw = file.read_bytes()
        except FileNotFoundError:  # taken meanwhile: another ingest, or the fetcher
            continue
        yield Incoming(f"{given}:{_unique_name(file.name)}", raw,
                       file if unseen_only else None)


def mark_seen(file: Path) -> None:
    """Move a Maildir message to cur/ with the S (seen) flag, as a mail reader does once
    it has read it. One taken meanwhile (another ingest, the fetcher) is left alone."""
    flags = "".join(sorted(set(_flags(file.name)) | {"S"}))
    with contextlib.suppress(FileNotFoundError):
        file.rename(file.parent.parent / "cur" / f"{_unique_name(file.name)}:2,{flags}")


def _unique_name(name: str) -> str:
    """A Maildir file's name without its info (`:2,FLAGS`)."""
    return name.partition(":")[0]


def _flags(name: str) -> str:
    info = name.partition(":")[2]
    return info[2:] if info.startswith("2,") else ""


def _split(name: str, raw: bytes) -> Iterator[Incoming]:
    if not raw.startswith(b"From "):
        yield Incoming(name, raw)
        return
    # An mbox, or one message after the From_ line an MTA's pipe wrote: its first line is a
    # From_ line whatever it holds (no message starts with "From "), the others only where
    # one separates two messages (_separates).
    starts = [0, *(line.start() for line in FROM_LINE.finditer(raw, 1)
                   if _separates(raw, line.start())), len(raw)]
    for i, (start, end) in enumerate(itertools.pairwise(starts)):
        body = raw[start:end].partition(b"\n")[2]
        # mboxrd: ">From " at a line start was a "From " of the message.
        body = body.replace(b"\n>From ", b"\nFrom ")
        yield Incoming(f"{name}#{i + 1}", body)


def _separates(raw: bytes, at: int) -> bool:
    """Whether the From_ line at `at` starts another message: an mbox writes a blank line
    before it, and the message's headers after it. A pipe quotes none of its message's
    lines, and a text's `From bob Mon Jan  5 12:00:00 2026 wrote:` cut a bounce in two."""
    after = raw.find(b"\n", at) + 1
    return raw[max(0, at - 3):at].endswith((b"\n\n", b"\n\r\n")) and after > 0 and \
        HEADER_LINE.match(raw, after) is not None


def ingest(engine: Engine, raw: bytes, *, envelope_to: Sequence[str] = (),
           return_path: ReturnPath | None, policy: SuppressionPolicy,
           max_bytes: int | None = None,
           unsubscribe: UnsubscribeLinks | None = None,
           cut: Cut | None = None) -> list[Recorded]:
    """Parse one message and record each report it holds, in one transaction. Empty
    input (an empty file, an mbox emptied after it was read, nothing on stdin) is no
    message: nothing is recorded, and [] is returned. `cut`: `raw` is the head of a message
    past `max_bytes` (messages() reads stdin so)."""
    if cut is None and not raw.strip():
        return []
    reports = read_mail(raw, envelope_to=envelope_to, return_path=return_path,
                        max_bytes=max_bytes, unsubscribe=unsubscribe, cut=cut)
    # Run again should it lose to a receiver or a webhook recording at the same time.
    return in_transaction(engine, lambda conn: record_many(conn, reports, policy),
                          what="feedback.ingest")


def read_mail(raw: bytes, *, envelope_to: Sequence[str] = (),
              return_path: ReturnPath | None, max_bytes: int | None = None,
              unsubscribe: UnsubscribeLinks | None = None,
              cut: Cut | None = None) -> list[Feedback]:
    """The reports one message holds: a `mailto:` unsubscribe, else what parse_mail reads."""
    if cut is None and (max_bytes is None or len(raw) <= max_bytes):
        found = mailto_unsubscribe(raw, envelope_to, unsubscribe)
        if found is not None:
            return [found]
    return parse_mail(raw, envelope_to=envelope_to, return_path=return_path,
                      max_bytes=max_bytes, cut=cut)
