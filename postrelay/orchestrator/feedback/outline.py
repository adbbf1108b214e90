"""The outline of a report (RFC 6522 `multipart/report`): what classifying it reads, and no
more. email's parser reads every line of every part -- the human-readable notice, the
returned message's whole body -- though a DSN's or an ARF report's classification needs
only the message's headers, the report fields and the returned message's headers.

    msg = outline(raw)   # a Message tree as email builds it, or None: parse it whole

The outline is a `Message` of the same shape (the top-level parts in order, each with its
headers), in which the report part keeps its body, the returned message (message/rfc822)
is its headers alone and every other part its undecoded text. Anything it does not expect
(no boundary, no closing delimiter, an encoded report part, another kind of message)
gives None, and the caller parses the message whole.
"""

from __future__ import annotations

import re
from email.message import Message
from email.policy import Compat32
from typing import Any

REPORT_TYPES = ("delivery-status", "feedback-report")
# The parts whose bodies classification reads, which must then be plain text on the wire.
READ_PARTS = ("message/delivery-status", "message/global-delivery-status",
              "message/feedback-report", "text/rfc822-headers", "text/global-headers")
RETURNED = ("message/rfc822", "message/global")
STATUS_PARTS = ("message/delivery-status", "message/global-delivery-status")
PLAIN_ENCODINGS = ("", "7bit", "8bit", "binary")
# What follows the boundary on a delimiter line: `--` on the closing one, blanks, its end.
DELIMITER_END = re.compile(rb"(--)?[ \t]*\r?(?:\n|\Z)")
NEWLINE, CR = ord("\n"), ord("\r")
# Between a report's blocks: a line break, blank lines, a line break. Each block is stripped
# after the split, so a CR before the first LF may stay with the block before it; a pattern
# that starts with one optional character is tried at every character instead of at LFs.
BLANK_TEXT_LINE = re.compile(r"\n\s*\n")
# A field: its name and colon, then its value to the end of the line and over every
# continuation line (one that starts with a blank); lines end where email.feedparser's
# NLCRE_crack ends them.
FIELD = re.compile(r"([\041-\071\073-\176]+):[ \t]*"
                   r"([^\r\n]*(?:(?:\r\n|\r|\n)[ \t][^\r\n]*)*)(?:\r\n|\r|\n|\Z)")
# A Content-Type of the plain form MTAs write: a type, then `name=token` or `name="text"`
# parameters; no comments, escapes, RFC 2231 names, or a stray `;`. Its parameters are
# read here as email's parser reads them; any other value is left to email.
PARAM = re.compile(r';\s*([A-Za-z0-9._-]+)\s*=\s*(?:"([^"\\]*)"|([^\s;"\\<>*\'()]+))')
PLAIN_PARAMS = re.compile(r'\s*([^\s;="\\]+)((?:\s*' + PARAM.pattern + r')*)\s*')


class _TextHeaders(Compat32):
    """compat32 (the lenient parser: the modern policy raises on headers real MTAs write),
    except that a header holding raw 8-bit bytes reads as UTF-8 text, not as a Header
    object, on which no str method works: SMTPUTF8 senders write such headers, and an
    out-of-office's Subject or a bounce's From (which flufl.bounce reads) failed the parse."""

    def header_fetch_parse(self, name: str, value: str) -> Any:
        if isinstance(value, str) and not value.isascii():
            return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        return super().header_fetch_parse(name, value)


READ_POLICY = _TextHeaders()


def outline(raw: bytes) -> Message | None:
    head, body = _split(raw)
    top = _headers(head)
    if top is None or top.get_content_type() != "multipart/report" or \
            str(top.get_param("report-type") or "").lower() not in REPORT_TYPES or \
            _encoding(top) not in PLAIN_ENCODINGS:
        return None
    boundary = top.get_boundary()
    if not boundary or not boundary.isascii():
        return None
    parts = _parts(body, boundary.encode("ascii"))
    if parts is None:
        return None
    read = False
    for raw_part in parts:
        part_head, part_body = _split(raw_part)
        part = _headers(part_head)
        if part is None:
            return None
        kind = part.get_content_type()
        if kind in RETURNED:
            returned = _headers(_split(part_body)[0])
            if returned is None:
                return None
            part.attach(returned)
        elif kind in READ_PARTS and _encoding(part) not in PLAIN_ENCODINGS:
            return None
        elif kind in STATUS_PARTS:  # its blocks of fields, as email's parser gives them
            blocks = [_fields(block.strip() + "\n") for block in BLANK_TEXT_LINE.split(
                part_body.decode("ascii", "surrogateescape")) if block.strip()]
            if not blocks or any(b is None for b in blocks):
                return None
            part.set_payload([b for b in blocks if b is not None])
            read = True
        else:
            read = read or kind in READ_PARTS
            part.set_payload(part_body.decode("ascii", "surrogateescape"))
        top.attach(part)
    # Without a report part at the top, it is nested or missing: the whole parse finds it.
    return top if read else None


def _split(data: bytes) -> tuple[bytes, bytes]:
    """Headers and body, at the first blank line: a line break (LF or CRLF) right after
    another. Found by two finds: a pattern that may begin with a CR is tried at every byte."""
    crlf = data.find(b"\n\r\n")
    lf = data.find(b"\n\n", 0, crlf + 2 if crlf >= 0 else len(data))  # only if earlier
    at = lf if lf >= 0 else crlf
    if at < 0:
        return data, b""
    start = at - 1 if at and data[at - 1] == CR else at
    return data[:start], data[at + (2 if data[at + 1] == NEWLINE else 3):]


def _headers(head: bytes) -> Message | None:
    """The header block as email's parser reads it (compat32: the same raw values, set the
    same way); None for a line it would take as the start of a body, or a Unix From line."""
    return _fields(head.decode("ascii", "surrogateescape"))


class _Part(Message):
    """A message or part of an outline. Classification asks its headers the same few
    questions many times (a field's value, the Content-Type's parameters), so the outline
    indexes each field as it reads it rather than scanning every header per question, and
    parses a field's parameters once. Its headers are read-only once read."""

    def __init__(self) -> None:
        super().__init__(READ_POLICY)
        self._first: dict[str, tuple[str, Any]] = {}  # lower name: its first field
        self._params: dict[str, Any] = {}  # lower name: its parsed parameters
        self._content_type: str | None = None  # from its Content-Type field, once read

    def set_raw(self, name: str, value: Any) -> None:
        super().set_raw(name, value)
        self._first.setdefault(name.lower(), (name, value))

    def set_fields(self, fields: list[tuple[str, str]]) -> None:
        """A whole header block at once: what set_raw does for each field, in order."""
        self._headers.extend(fields)  # type: ignore[attr-defined]
        for name, value in reversed(fields):  # the first field of a name is the one kept
            self._first[name.lower()] = (name, value)

    def get(self, name: str, failobj: Any = None) -> Any:
        found = self._first.get(name.lower())
        if found is None:
            return failobj
        value = found[1]
        # compat32 hands an ASCII value back as it is (only bytes smuggled in as
        # surrogates make it a Header): the usual case skips the policy's checks.
        return value if value.isascii() else self.policy.header_fetch_parse(*found)

    def get_content_type(self) -> str:
        if self._content_type is None:
            if "content-type" not in self._first:  # the default, which a parent may set
                return super().get_content_type()
            self._content_type = super().get_content_type()
        return self._content_type

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._first

    def _get_params_preserve(self, failobj: Any, header: str) -> Any:
        key = header.lower()
        if key not in self._params:
            self._params[key] = _plain_params(self.get(header)) or \
                super()._get_params_preserve(_MISSING, header)  # type: ignore[misc]
        found = self._params[key]
        return failobj if found is _MISSING else found

    def __setitem__(self, name: str, value: Any) -> None:
        raise TypeError("an outline's headers are read-only")

    def __delitem__(self, name: str) -> None:
        raise TypeError("an outline's headers are read-only")

    def add_header(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("an outline's headers are read-only")

    def replace_header(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("an outline's headers are read-only")


_MISSING = object()


def _plain_params(value: Any) -> list[tuple[str, str]] | None:
    """The parameters of a value of the plain form (PLAIN_PARAMS) as email lists them: the
    type first, then each name in lower case with its value quoted; None for any other."""
    plain = PLAIN_PARAMS.fullmatch(value) if isinstance(value, str) else None
    if plain is None:
        return None
    return [(plain[1], ""), *((name.lower(), f'"{quoted}{token}"')
                              for name, quoted, token in PARAM.findall(plain[2]))]


def _fields(text: str) -> Message | None:
    fields = []
    at = 0
    for field in FIELD.finditer(text):
        if field.start() != at:  # neither a field nor its continuation: not a header block
            return None
        # compat32's header_source_parse: the value after the colon, leading blanks and
        # the final line break left out, inner line breaks kept.
        fields.append((field[1], field[2]))
        at = field.end()
    if at != len(text):
        return None
    msg = _Part()
    msg.set_fields(fields)
    return msg


def _encoding(part: Message) -> str:
    return str(part.get("content-transfer-encoding") or "").strip().lower()


def _parts(body: bytes, boundary: bytes) -> list[bytes] | None:
    """The bodies between the delimiter lines (RFC 2046 section 5.1.1); None without a
    closing delimiter. Found with find rather than a pattern made of the boundary: every
    DSN has a boundary of its own (Postfix's holds the queue id), and compiling a pattern
    per message cost about as much as the rest of the parse."""
    delimiter = b"--" + boundary
    if b"\n" in delimiter:  # not a boundary a delimiter line can hold
        return None
    parts: list[bytes] = []
    start: int | None = None
    at = 0
    while (found := body.find(delimiter, at)) >= 0:
        at = found + len(delimiter)
        tail = DELIMITER_END.match(body, at)
        if (found and body[found - 1] != NEWLINE) or tail is None:
            continue  # the boundary's text inside a line, not a delimiter line
        if start is not None:
            # The line break before a delimiter belongs to the delimiter.
            end = found
            end -= 2 if body[end - 2:end] == b"\r\n" else 1 if body[end - 1:end] == b"\n" else 0
            parts.append(body[start:max(start, end)])
        if tail.group(1):
            return parts
        start = at = tail.end()
    return None
