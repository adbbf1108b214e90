"""The human-readable text of a bounce, as the readers of parse.py look into it: its text
parts, its notice (the text but the message it returns), the line or paragraph that names
an address, the Message-ID it quotes.

    notice = notice_text(msg)           # codes are read here, never from the original
    near(notice, "ann@example.com")     # the 300 characters from the address on
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from email.message import Message

from postrelay.orchestrator.feedback.outline import BLANK_TEXT_LINE

# The returned message, or its headers, as a bounce attaches it.
RETURNED_PARTS = ("message/rfc822", "message/global", "text/rfc822-headers",
                  "text/global-headers")
# Where a bounce that quotes the original inline (qmail, Exim) starts it.
RETURNED_HEADERS = re.compile(r"^(?:Return-Path|Received):", re.IGNORECASE | re.MULTILINE)
QUOTED_MESSAGE_ID = re.compile(r"^\s*Message-ID:\s*(<[^<>\s]+>)", re.IGNORECASE | re.MULTILINE)


def body_text(msg: Message) -> str:
    """Every text part of `msg`, the returned message's included."""
    return "\n".join(texts(msg))


def notice_text(msg: Message) -> str:
    """The text of a bounce but the returned message: its parts but an attached original
    (or its headers), and up to the original it quotes inline (qmail's and Exim's start
    with its Return-Path or Received line)."""
    text = "\n".join(texts(msg, but=RETURNED_PARTS))
    quoted = RETURNED_HEADERS.search(text)
    return text[:quoted.start()] if quoted else text


def texts(part: Message, but: tuple[str, ...] = ()) -> Iterable[str]:
    """The decoded text parts of `part`, in order, but those in parts of the types `but`."""
    if part.get_content_type() in but:
        return
    if part.is_multipart():
        for sub in part.get_payload():
            if isinstance(sub, Message):
                yield from texts(sub, but)
    # A multipart whose boundary never comes (another than the one declared, or indented)
    # is one text to email, which holds the notice and the report's fields.
    elif part.get_content_maintype() in ("text", "multipart"):
        try:
            payload = part.get_payload(decode=True)
        except Exception:  # noqa: BLE001 - CPython 3.11 fails on a bodiless quoted-printable
            given = part.get_payload()
            payload = given.encode("utf-8", "surrogateescape") if isinstance(given, str) else b""
        if isinstance(payload, bytes):
            try:
                yield payload.decode(part.get_content_charset() or "utf-8", "replace")
            except LookupError:  # a charset Python does not know
                yield payload.decode("utf-8", "replace")


def quoted_message_id(text: str) -> str | None:
    match = QUOTED_MESSAGE_ID.search(text)
    return match.group(1) if match else None


def line_naming(text: str, address: str) -> str | None:
    """The first line of `text` that names `address`."""
    needle = address.lower()
    return next((line.strip() for line in text.splitlines() if needle in line.lower()), None)


def first_text_part(msg: Message) -> Message:
    """`msg`'s first text/plain part, a notice's, not the returned headers; else `msg`."""
    return next((part for part in msg.walk() if part.get_content_type() == "text/plain"), msg)


def paragraph(text: str, address: str, failed: Iterable[str] = ()) -> str | None:
    """`text` from where it names `address` to the blank line after it or to where it names
    another of the `failed` addresses, on one line."""
    lowered, needle = text.lower(), address.lower()
    at = lowered.find(needle)
    if at < 0:
        return None
    start = at + len(needle)
    blank = BLANK_TEXT_LINE.search(text, start)
    ends = [blank.start() if blank else len(text)]
    ends += [found for other in failed if other.lower() != needle
             and (found := lowered.find(other.lower(), start)) >= 0]
    return " ".join(text[at:min(ends)].split())


def near(text: str, address: str) -> str | None:
    """The 300 characters of `text` from where it names `address`, on one line."""
    at = text.lower().find(address.lower())
    if at < 0:
        return None
    return " ".join(text[at:at + 300].split())
