"""Building the MIME message of one email from a rendered template.

Every header value goes through `check_header_value` here, whatever the caller checked
before: this is the last point where a line break can still be refused. Bcc recipients are
envelope-only; they never reach this module (see `envelope_recipients`).

    msg = build_message(rendered=templates.render("welcome", {"user": "Ada"}),
                        sender=parse_address("Shop <shop@example.com>", field="from"),
                        to=[parse_address("Ada <ada@example.com>", field="to")],
                        message_id=message_id_for(job.id, "example.com"))
"""

from __future__ import annotations

import base64
import functools
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from email.charset import QP, Charset
from email.headerregistry import Address
from email.message import Message
from email.mime.multipart import MIMEMultipart
from email.policy import Compat32
from email.utils import format_datetime, formataddr
from typing import Any

from postrelay.core.errors import ValidationError
from postrelay.core.limits import SURROGATE_RULE
from postrelay.orchestrator.addresses import check_display_name, check_header_value
from postrelay.orchestrator.templates import Rendered

__all__ = ["build_message", "check_header_lines", "envelope_recipients", "message_id_domain",
           "message_id_for"]


class Folded(str):
    """A header value `build_message` has folded itself: 7-bit, its lines joined by CRLF and
    a space, every line within RFC 5322's 998 octets. Written as it is."""

    __slots__ = ()


class _Compat32(Compat32):
    """compat32, except that an ASCII header that fits on its line is written as it is, and
    so is a value `build_message` folded itself (`Folded`).

    compat32 runs every header value through `email.header.Header`'s folding, which was
    five sixths of the time it took to write a message out; for a printable ASCII value
    whose line fits, what that folding writes is the value itself (tests/orchestrator/
    test_message.py checks this against compat32 on random values). Nor can that folding
    split a word longer than a line, or a display name it encoded as one encoded-word: the
    headers build_message writes are folded by `_fold_*` below instead."""

    def fold(self, name: str, value: Any) -> str:
        line = self._one_line(name, value)
        return line if line is not None else super().fold(name, value)

    def fold_binary(self, name: str, value: Any) -> bytes:
        line = self._one_line(name, value)
        return line.encode("ascii") if line is not None else super().fold_binary(name, value)

    def _one_line(self, name: str, value: Any) -> str | None:
        if isinstance(value, Folded):
            return f"{name}: {value}{self.linesep}"
        if (isinstance(value, str) and value.isascii() and value.isprintable()
                and self.max_line_length is not None
                and len(name) + 2 + len(value) <= self.max_line_length):
            return f"{name}: {value}{self.linesep}"
        return None


# SMTP line endings, RFC 2047 for non-ASCII headers, and 7-bit quoted-printable bodies: the
# message then needs neither SMTPUTF8 nor 8BITMIME from the server. The message is built
# with the classic (compat32) API and headers encoded by hand: the header-registry API of
# `email.policy.default` parses every header it is given again, which made building a
# message cost more than sending it.
POLICY = _Compat32(linesep="\r\n")
UTF8 = Charset("utf-8")
UTF8.header_encoding = QP
UTF8.body_encoding = QP
HEADER_WIDTH = 76
LINE_SOFT_LIMIT = 78  # RFC 5322 2.1.1: lines SHOULD be at most 78 characters ...
LINE_LIMIT = 998  # ... and MUST be at most 998, CRLF excluded
MAX_HEADER_NAME = 76
MAX_DOMAIN = 253  # the longest DNS name
_ENCODED_WORD_MAX = 75  # RFC 2047 2
_EW_PREFIX = {"q": "=?utf-8?q?", "b": "=?utf-8?b?"}
# RFC 2047 5(3): what a Q encoded-word in a display name may hold as itself (also the set
# Python's own header encoder keeps); a space is written as "_", everything else as =XX.
_Q_SAFE = frozenset(b"!*+-/0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_Q_BYTE = {b: chr(b) if b in _Q_SAFE else f"={b:02X}" for b in range(256)}
_Q_BYTE[0x20] = "_"
_Q_LENGTH = {b: len(text) for b, text in _Q_BYTE.items()}
_WORDS = re.compile(r"([ \t]*)([^ \t]+)|([ \t]+)$")

_FIELD_NAME = re.compile(r"[!-9;-~]+")  # RFC 5322 ftext: printable ASCII except ':'
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_MESSAGE_ID = re.compile(r"<[^<>@\s]+@[^<>@\s]+>")
# Headers build_message writes itself. As extra headers they would duplicate or contradict
# them; Bcc in particular must never be written into the message.
_RESERVED = frozenset({"from", "to", "cc", "bcc", "reply-to", "subject", "date", "message-id",
                       "mime-version", "sender", "return-path"})
_RESERVED_PREFIXES = ("content-", "resent-")


def message_id_for(job_id: uuid.UUID, domain: str) -> str:
    """`<job_id@domain>`: the same on every attempt of the job, so a message resent after
    an unknown outcome carries the Message-ID of the first try and receivers can drop it."""
    _check_message_id_domain(domain)
    if type(job_id) is not uuid.UUID:  # a string, say: written in the canonical form
        job_id = uuid.UUID(str(job_id))
    return f"<{job_id}@{domain}>"


# Pure, and the same domain for every message of a route; refusals are not cached.
@functools.lru_cache(maxsize=256)
def _check_message_id_domain(domain: str) -> None:
    check_header_value(domain, field="message_id_domain")
    if len(domain) > MAX_DOMAIN:
        raise ValidationError("message_id_domain", f"is {len(domain)} characters: a domain "
                                                   f"name has at most {MAX_DOMAIN}")
    if not _DOMAIN.fullmatch(domain):
        raise ValidationError("message_id_domain", f"{domain!r} is not an ASCII domain name "
                                                   "(use the IDNA form of a non-ASCII one)")


def message_id_domain(settings_domain: str | None, from_address: Address) -> str:
    """The configured Message-ID domain, or else the domain of the From address."""
    if settings_domain and settings_domain.strip():
        return settings_domain.strip()
    return from_address.domain


def build_message(*, rendered: Rendered, sender: Address, to: Sequence[Address],
                  cc: Sequence[Address] = (), reply_to: Sequence[Address] = (),
                  message_id: str, headers: Mapping[str, str] | None = None,
                  date: datetime | None = None) -> Message:
    """The message to hand to the SMTP server: text/plain, or multipart/alternative with
    text/html when the template has a body.html. Raises ValidationError naming the field
    (`subject`, `to[1]`, `headers.X-Foo`, ...) for anything that could inject a header."""
    fields: list[tuple[str, str]] = [("From", _sender(sender))]
    if to:  # an all-Bcc message has no To header
        fields.append(("To", _addresses("To", to, "to")))
    if cc:
        fields.append(("Cc", _addresses("Cc", cc, "cc")))
    if reply_to:
        fields.append(("Reply-To", _addresses("Reply-To", reply_to, "reply_to")))
    fields.append(("Subject", _unstructured(
        "Subject", check_header_value(rendered.subject, field="subject"), "subject")))
    fields.append(("Date", _date_now() if date is None else format_datetime(_aware(date))))
    check_header_value(message_id, field="message_id")
    if not _MESSAGE_ID.fullmatch(message_id):
        raise ValidationError("message_id", f"{message_id!r} is not '<id@domain>'")
    if len("Message-ID: ") + len(message_id) > LINE_LIMIT:
        raise ValidationError("message_id", f"is {len(message_id)} characters: a Message-ID "
                                            f"cannot be folded, and its line would be longer "
                                            f"than {LINE_LIMIT} octets")
    fields.append(("Message-ID", message_id))
    for name, value in (headers or {}).items():
        field = f"headers.{name}"
        fields.append((_header_name(name),
                       _unstructured(name, check_header_value(value, field=field), field)))
    if rendered.html is None:
        msg: Message = _text_part(rendered.text, "plain")
    else:
        msg = MIMEMultipart("alternative", policy=POLICY)
        msg.attach(_text_part(rendered.text, "plain"))
        msg.attach(_text_part(rendered.html, "html"))
    for name, value in fields:
        msg[name] = value
    return msg


def envelope_recipients(to: Iterable[Address], cc: Iterable[Address] = (),
                        bcc: Iterable[Address] = ()) -> list[str]:
    """Every RCPT TO address once (compared case-insensitively), in To, Cc, Bcc order."""
    seen: set[str] = set()
    result = []
    for address in (*to, *cc, *bcc):
        spec = address.addr_spec
        if spec.lower() not in seen:
            seen.add(spec.lower())
            result.append(spec)
    return result


def _sender(sender: Address) -> str:
    """The From header's value: the same for every message of a route, so cached."""
    if not isinstance(sender, Address):
        return _addresses("From", [sender], "from")  # refused there, naming the field
    return _one_sender(sender.display_name, sender.username, sender.domain)


# Keyed by the strings an Address is made of (pure); refusals are not cached.
@functools.lru_cache(maxsize=256)
def _one_sender(display_name: str, username: str, domain: str) -> str:
    return _addresses("From", [Address(display_name, username, domain)], "from")


def _addresses(name: str, addresses: Sequence[Address], field: str) -> str:
    """The header value: `Name <a@b>, ...`, folded between words and between addresses; a
    display name that is not ASCII, or has a word too long for a line, is written as RFC
    2047 encoded-words, which can be split anywhere."""
    # Addresses are normally built by parse_address; these checks catch hand-built ones.
    words: list[tuple[str, str]] = []
    for i, address in enumerate(addresses):
        where = field if field == "from" else f"{field}[{i}]"
        if not isinstance(address, Address):
            raise ValidationError(where, f"must be an Address, not {type(address).__name__}")
        check_header_value(address.display_name, field=where)
        check_display_name(address.display_name, field=where)
        check_header_value(address.addr_spec, field=where)
        if words:
            words[-1] = (words[-1][0], words[-1][1] + ",")
        words.extend(_mailbox_words(name, address))
    if len(words) == 1 and len(name) + 2 + len(words[0][1]) <= LINE_SOFT_LIMIT:
        return words[0][1]  # the common case: one short mailbox, as compat32 writes it
    return _layout(name, words, field)


def _mailbox_words(name: str, address: Address) -> list[tuple[str, str]]:
    """(whitespace before, word) pairs of one mailbox; the first has a space before it."""
    spec = address.addr_spec
    display = address.display_name
    if not display:
        return [(" ", spec)]
    if display.isascii():
        words = _split_words(" " + formataddr((display, spec)))
        if all(len(name) + 2 + len(word) <= LINE_LIMIT for _, word in words):
            return words
    # Encoded-words: also in a display name (RFC 2047 5(3)), with phrase-safe characters.
    encoded = _encoded_words(display, LINE_SOFT_LIMIT - len(name) - 2)
    return [(" ", word) for word in encoded] + [(" ", f"<{spec}>")]


def _unstructured(name: str, value: str, field: str) -> str:
    """An unstructured header value (Subject, extra headers), folded: ASCII at its spaces
    (a fold only ever comes before whitespace that was there), anything else, or a word
    too long for a line, as encoded-words, which decoders join back without the folds."""
    if value.isascii() and len(name) + 2 + len(value) <= LINE_SOFT_LIMIT:
        return value  # the fast path of _Compat32 writes it as it is
    if value.isascii():
        words = _split_words(" " + value)
        if all(len(name) + 2 + len(word) <= LINE_LIMIT for _, word in words):
            return _layout(name, words, field)
    encoded = _encoded_words(value, LINE_SOFT_LIMIT - len(name) - 2)
    return _layout(name, [(" ", word) for word in encoded], field)


def _split_words(text: str) -> list[tuple[str, str]]:
    """`text` as (whitespace before, word) pairs; trailing whitespace joins the last word."""
    pairs: list[tuple[str, str]] = []
    for match in _WORDS.finditer(text):
        if match[3] is not None:
            pairs[-1] = (pairs[-1][0], pairs[-1][1] + match[3])
        else:
            pairs.append((match[1], match[2]))
    return pairs


def _encoded_words(text: str, first: int = _ENCODED_WORD_MAX) -> list[str]:
    """`text` as UTF-8 encoded-words of at most 75 characters each (the first at most
    `first`, so that it fits beside the header's name), split between characters (never
    inside one); Q or B, whichever is shorter for the whole text."""
    data = text.encode("utf-8")
    q_length = sum(map(_Q_LENGTH.__getitem__, data))
    q = q_length <= (len(data) + 2) // 3 * 4
    prefix = _EW_PREFIX["q" if q else "b"]
    overhead = len(prefix) + 2

    def room(word_length: int) -> int:  # Q: encoded characters; B: bytes before base64
        chars = max(min(word_length, _ENCODED_WORD_MAX), overhead + 12) - overhead
        return chars if q else chars // 4 * 3

    first_room = room(first)
    if (q_length if q else len(data)) <= first_room:  # the usual case: one word
        return [_encoded_word(q, prefix, data)]
    chunks: list[bytearray] = [bytearray()]
    size, limit = 0, first_room
    for char in text:
        raw = char.encode("utf-8")
        cost = sum(map(_Q_LENGTH.__getitem__, raw)) if q else len(raw)
        if chunks[-1] and size + cost > limit:
            chunks.append(bytearray())
            size, limit = 0, room(_ENCODED_WORD_MAX)
        chunks[-1] += raw
        size += cost
    return [_encoded_word(q, prefix, bytes(chunk)) for chunk in chunks]


def _encoded_word(q: bool, prefix: str, data: bytes) -> str:
    if q:
        return f"{prefix}{''.join(map(_Q_BYTE.__getitem__, data))}?="
    return f"{prefix}{base64.b64encode(data).decode('ascii')}?="


def _layout(name: str, words: list[tuple[str, str]], field: str) -> Folded:
    """Lay words out on lines of at most 78 characters where they fit, folding before the
    whitespace in front of a word (the first word stays on the header's first line).
    Raises ValidationError naming `field` if a line would still exceed 998 octets."""
    lines: list[str] = []
    line = f"{name}:"
    first = True
    for space, word in words:
        if first or len(line) + len(space) + len(word) <= LINE_SOFT_LIMIT:
            line += space + word
        else:
            lines.append(line)
            line = space + word
        first = False
    lines.append(line)
    for text in lines:
        if len(text) > LINE_LIMIT:
            raise ValidationError(field, f"cannot be folded into header lines of at most "
                                         f"{LINE_LIMIT} octets (RFC 5322)")
    return Folded("\r\n".join(lines)[len(name) + 2:])


def check_header_lines(data: bytes) -> None:
    """Raise ValidationError naming the header if any line of the message's header block
    is longer than RFC 5322's 998 octets: such a message is never handed to a server (it
    would refuse it, and the refusal would read as the recipient's)."""
    head = data.split(b"\r\n\r\n", 1)[0]
    if len(head) <= LINE_LIMIT:  # no line of it can be longer: the usual message
        return
    current = "headers"
    for line in head.split(b"\r\n"):
        if line[:1] not in (b" ", b"\t"):
            current = line.split(b":", 1)[0].decode("ascii", "replace")
        if len(line) > LINE_LIMIT:
            raise ValidationError(current.lower(), f"header line of {len(line)} octets: "
                                                   f"longer than RFC 5322's {LINE_LIMIT}")


def _text_part(body: str, subtype: str) -> Message:
    """The part MIMENonMultipart("text", subtype) and set_payload(body, UTF8) make, header
    for header and byte for byte, without their parsing and rewriting of Content-Type."""
    part = Message(policy=POLICY)
    part["MIME-Version"] = "1.0"
    part["Content-Type"] = f'text/{subtype}; charset="utf-8"'
    part["Content-Transfer-Encoding"] = "quoted-printable"
    try:
        encoded = UTF8.body_encode(body)
    except UnicodeEncodeError:
        # A lone surrogate (a Jinja escape such as "\udc80" renders one): bad input, named,
        # not an error the worker would take for a passing one and retry until dead.
        raise ValidationError("text" if subtype == "plain" else subtype,
                              SURROGATE_RULE) from None
    part.set_payload(encoded)
    return part


def _header_name(name: str) -> str:
    check_header_value(name, field="headers")
    if not _FIELD_NAME.fullmatch(name):
        raise ValidationError("headers", f"{name!r} is not a header name (printable ASCII, "
                                         "no space or ':')")
    if len(name) > MAX_HEADER_NAME:
        # A name cannot be folded: it must leave its first line room for the value.
        raise ValidationError("headers", f"{name[:40]!r}...: a header name has at most "
                                         f"{MAX_HEADER_NAME} characters")
    lowered = name.lower()
    if lowered in _RESERVED or lowered.startswith(_RESERVED_PREFIXES):
        raise ValidationError(f"headers.{name}", "is set by postrelay and cannot be overridden")
    return name


def _date_now() -> str:
    return _date_of(int(time.time()))


@functools.lru_cache(maxsize=2)
def _date_of(second: int) -> str:
    """The Date header of a message built in this second (written once a second)."""
    return format_datetime(datetime.fromtimestamp(second, UTC))


def _aware(date: datetime | None) -> datetime:
    if date is None:
        return datetime.now(UTC)
    if date.tzinfo is None or date.utcoffset() is None:
        raise ValidationError("date", "must be timezone-aware")
    return date
