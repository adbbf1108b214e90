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

import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from email.charset import QP, Charset
from email.header import Header
from email.headerregistry import Address
from email.message import Message
from email.mime.multipart import MIMEMultipart
from email.mime.nonmultipart import MIMENonMultipart
from email.policy import Compat32
from email.utils import format_datetime, formataddr
from typing import Any

from postrelay.core.errors import ValidationError
from postrelay.orchestrator.addresses import check_header_value
from postrelay.orchestrator.templates import Rendered

__all__ = ["build_message", "envelope_recipients", "message_id_domain", "message_id_for"]


class _Compat32(Compat32):
    """compat32, except that an ASCII header that fits on its line is written as it is.

    compat32 runs every header value through `email.header.Header`'s folding, which was
    five sixths of the time it took to write a message out; for a printable ASCII value
    whose line fits, what that folding writes is the value itself (tests/orchestrator/
    test_message.py checks this against compat32 on random values)."""

    def fold(self, name: str, value: Any) -> str:
        line = self._one_line(name, value)
        return line if line is not None else super().fold(name, value)

    def fold_binary(self, name: str, value: Any) -> bytes:
        line = self._one_line(name, value)
        return line.encode("ascii") if line is not None else super().fold_binary(name, value)

    def _one_line(self, name: str, value: Any) -> str | None:
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
    check_header_value(domain, field="message_id_domain")
    if not _DOMAIN.fullmatch(domain):
        raise ValidationError("message_id_domain", f"{domain!r} is not an ASCII domain name "
                                                   "(use the IDNA form of a non-ASCII one)")
    return f"<{uuid.UUID(str(job_id))}@{domain}>"


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
    fields: list[tuple[str, str]] = [("From", _addresses([sender], "from"))]
    if to:  # an all-Bcc message has no To header
        fields.append(("To", _addresses(to, "to")))
    if cc:
        fields.append(("Cc", _addresses(cc, "cc")))
    if reply_to:
        fields.append(("Reply-To", _addresses(reply_to, "reply_to")))
    fields.append(("Subject", _encoded(check_header_value(rendered.subject, field="subject"))))
    fields.append(("Date", format_datetime(_aware(date))))
    check_header_value(message_id, field="message_id")
    if not _MESSAGE_ID.fullmatch(message_id):
        raise ValidationError("message_id", f"{message_id!r} is not '<id@domain>'")
    fields.append(("Message-ID", message_id))
    for name, value in (headers or {}).items():
        fields.append((_header_name(name),
                       _encoded(check_header_value(value, field=f"headers.{name}"))))
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


def _addresses(addresses: Sequence[Address], field: str) -> str:
    """The header value: `Name <a@b>`, the name RFC 2047-encoded when it is not ASCII."""
    # Addresses are normally built by parse_address; these checks catch hand-built ones.
    for i, address in enumerate(addresses):
        where = field if field == "from" else f"{field}[{i}]"
        if not isinstance(address, Address):
            raise ValidationError(where, f"must be an Address, not {type(address).__name__}")
        check_header_value(address.display_name, field=where)
        check_header_value(address.addr_spec, field=where)
    return ", ".join(formataddr((a.display_name, a.addr_spec), UTF8) for a in addresses)


def _encoded(value: str) -> str | Header:
    return value if value.isascii() else Header(value, UTF8, maxlinelen=HEADER_WIDTH)


def _text_part(body: str, subtype: str) -> Message:
    part = MIMENonMultipart("text", subtype, policy=POLICY)
    part.set_payload(body, UTF8)
    return part


def _header_name(name: str) -> str:
    check_header_value(name, field="headers")
    if not _FIELD_NAME.fullmatch(name):
        raise ValidationError("headers", f"{name!r} is not a header name (printable ASCII, "
                                         "no space or ':')")
    lowered = name.lower()
    if lowered in _RESERVED or lowered.startswith(_RESERVED_PREFIXES):
        raise ValidationError(f"headers.{name}", "is set by postrelay and cannot be overridden")
    return name


def _aware(date: datetime | None) -> datetime:
    if date is None:
        return datetime.now(UTC)
    if date.tzinfo is None or date.utcoffset() is None:
        raise ValidationError("date", "must be timezone-aware")
    return date
