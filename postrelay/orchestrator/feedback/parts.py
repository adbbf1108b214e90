"""The parts and field values of a report as parse.py and dsn.py read them: a part by its
type, the returned original, a status part's blocks of fields, a typed address
(`rfc822; ann@example.com`), a value on one line.
"""

from __future__ import annotations

import email
import re
from collections.abc import Iterable
from email.errors import MissingHeaderBodySeparatorDefect
from email.message import Message
from typing import Any

from postrelay.orchestrator.feedback.outline import BLANK_TEXT_LINE, READ_POLICY

DETAIL_CHARS = 2000
# A line that starts a field: its name, then a colon.
FIELD_START = re.compile(r"[A-Za-z][A-Za-z0-9-]*:")
# RFC 6533's embedded-unicode-char: one character of a `utf-8` address, in hex.
EMBEDDED_UNICODE = re.compile(r"\\x\{([0-9A-Fa-f]{1,6})\}")


def part_of(msg: Message, types: Iterable[str]) -> Message | None:
    """The first part of `msg` of one of these types."""
    wanted = tuple(types)
    for part in msg.walk():
        if part.get_content_type() in wanted:
            return part
    return None


def status_blocks(part: Message) -> list[Message]:
    """The header blocks of a delivery-status or feedback-report part. email reads only
    message/delivery-status as blocks: an RFC 6533 message/global-delivery-status it reads
    as one message, the first block its headers and the others its body."""
    payload = part.get_payload()
    if isinstance(payload, list):
        blocks = [_mended(p) for p in payload if isinstance(p, Message)]
        rest = blocks[0].get_payload() if len(blocks) == 1 else None
        return [blocks[0], *blocks_of(rest)] if isinstance(rest, str) else blocks
    return blocks_of(payload if isinstance(payload, str) else "")


def blocks_of(text: str) -> list[Message]:
    """Blocks of fields written as text, a blank line between two."""
    return [_mended(email.message_from_string(block.strip() + "\n", policy=READ_POLICY))
            for block in BLANK_TEXT_LINE.split(text) if block.strip()]


def _mended(block: Message) -> Message:
    """A block one of whose continuation lines came without its leading blank (MessageLabs
    writes a Diagnostic-Code's `550-…` lines so): email ends the fields at that line and
    takes the rest, the Final-Recipient among them, for a body. Read again, with each such
    line the continuation it is."""
    rest = block.get_payload()
    if not isinstance(rest, str) or not rest.strip() or not any(
            isinstance(defect, MissingHeaderBodySeparatorDefect) for defect in block.defects):
        return block
    lines = [f"{name}: {value}" for name, value in block.items()]
    lines += [line if FIELD_START.match(line) or line[:1] in (" ", "\t") else f" {line}"
              for line in rest.splitlines() if line.strip()]
    return email.message_from_string("\n".join(lines) + "\n", policy=READ_POLICY)


def original_of(msg: Message) -> Message | None:
    """The message a report returns, or its headers."""
    for part in msg.walk():
        kind = part.get_content_type()
        if kind in ("message/rfc822", "message/global"):
            payload = part.get_payload()
            if isinstance(payload, list) and payload and isinstance(payload[0], Message):
                return payload[0]
        if kind in ("text/rfc822-headers", "text/global-headers"):
            return email.message_from_string(str(part.get_payload(decode=False)),
                                             policy=READ_POLICY)
    return None


def typed_address(value: str | None) -> str | None:
    """`rfc822; ann@example.com` → ann@example.com. A `utf-8` address in a
    message/delivery-status part writes its non-ASCII characters as `\\x{HEX}` (RFC 6533
    3): `utf-8; ann@b\\x{FC}cher.example` → ann@bücher.example."""
    if not value:
        return None
    kind, typed, address = value.partition(";")
    if not typed:
        kind, address = "", kind
    address = address.strip().strip("<>").strip()
    if "\\x{" in address and kind.strip().lower() == "utf-8":
        address = EMBEDDED_UNICODE.sub(_embedded_char, address)
    return address.lower() or None


def _embedded_char(found: re.Match[str]) -> str:
    """The character, if it is one RFC 6533 encodes (not ASCII, not a surrogate)."""
    code = int(found.group(1), 16)
    fits = 0x80 <= code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF
    return chr(code) if fits else found.group(0)


def clean(value: str | None) -> str | None:
    """A field's value on one line, None for an empty one."""
    return " ".join(str(value).split()) or None if value else None


def one_line(value: Any) -> str | None:
    """A value as a report's detail keeps it: on one line, DETAIL_CHARS at most."""
    if value is None:
        return None
    text = " ".join(str(value).split())
    return text[:DETAIL_CHARS] or None


def headers_of(msg: Message | None) -> dict[str, str] | None:
    """The headers of a returned message an operator reads a report by."""
    if msg is None:
        return None
    wanted = ("from", "to", "subject", "date", "message-id", "return-path")
    return {k: v for k in wanted if (v := one_line(msg.get(k)))} or None
