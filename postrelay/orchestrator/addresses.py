"""Strict email address parsing and header-injection refusal.

Addresses arrive in event payloads written by other systems, so they are parsed strictly:
exactly one mailbox per string (`user@example.com` or `Display Name <user@example.com>`),
no groups, no comments, nothing after the closing bracket. The addr-spec is checked for
syntax only; whether the domain takes mail is the SMTP server's call. A display name may not
hold the bidirectional controls that reorder what a mail client shows (BIDI_CONTROLS).

    >>> parse_address("Jürgen Müller <j@example.com>", field="to")
    Address(display_name='Jürgen Müller', username='j', domain='example.com')
"""

from __future__ import annotations

import base64
import binascii
import email.header
import functools
import re
import unicodedata
from collections.abc import Iterator, Sequence
from email.errors import HeaderParseError
from email.headerregistry import Address
from urllib.parse import unquote_to_bytes

import email_validator
from email_validator import EmailNotValidError, validate_email

from postrelay.core.errors import ValidationError
from postrelay.core.limits import checked_text

__all__ = ["AddressError", "check_display_name", "check_header_value", "parse_address",
           "parse_addresses"]

INJECTION_RULE = "must not contain a line break (header injection)"

# Everything str.splitlines() breaks on, plus NUL: any of them in a header value can end the
# header early in some mail software and start a forged one (Bcc:, a second body, ...).
_LINE_BREAKS = frozenset("\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\x00")
_BREAK_BYTES = frozenset(b"\r\n\x0b\x0c\x00")
_CONTROLS = frozenset(chr(c) for c in [*range(0x20), 0x7F]) - {"\t"}
_ENCODED_WORD = re.compile(r"=\?([^?\s]+)\?([qQbB])\?([^?\s]*)\?=")
# Unicode's explicit directional formatting (UAX #9): the embeddings and overrides LRE, RLE,
# PDF, LRO, RLO (U+202A-U+202E) and the isolates LRI, RLI, FSI, PDI (U+2066-U+2069). In a
# display name they reorder what a mail client shows: "Acme" can be made to read as another
# name, or an address-like string be hidden in it, and an override left open runs on into
# the address after the name. The marks LRM, RLM and ALM (U+200E, U+200F, U+061C) stay
# allowed: each acts as one strong letter, reorders no run, and is how right-to-left names
# are written. So do the other invisible format characters (ZWSP, ZWNJ, ZWJ, WJ, U+FEFF):
# they reorder nothing, ZWNJ and ZWJ are spelling in Persian and Indic names and in emoji,
# and a name that only looks like another can be written without them.
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")

# RFC 5322 specials: outside quotes they end the display name, so an unquoted name holding
# one of them would read as something else (two addresses, a group, a comment).
_SPECIALS = frozenset('()<>[]:;@\\,"')
_ANGLE = re.compile(r"(?P<name>.*?)\s*<(?P<addr>[^<>]*)>", re.DOTALL)
_QUOTED = re.compile(r'"(?P<text>(?:[^"\\]|\\.)*)"', re.DOTALL)
# The addr-specs _check_addr_spec may accept without parsing the whole address again: a
# lower-case dot-atom local part, which email-validator returns as it is (RFC 2142's
# case-insensitive names such as `Postmaster` are lower-cased by it, and are not in this
# set), at a domain of ASCII letters, digits, dots and hyphens.
_SIMPLE_LOCAL = re.compile(r"[a-z0-9_+-]+(?:\.[a-z0-9_+-]+)*")
_SIMPLE_DOMAIN = re.compile(r"[A-Za-z0-9.-]+")
# RFC 5321 4.5.3.1.1's local-part length, for the quick path alone: a longer one goes to
# email-validator, which takes it, as the RFC calls the limit soft.
_LOCAL_MAX = 64
ADDRESS_MAX = 254  # RFC 3696 errata 1690, as email-validator counts it

_VALIDATOR_OPTIONS = {
    "check_deliverability": False,  # no DNS at render time
    "globally_deliverable": False,  # accept dotless intranet domains such as `mailhost`
    "test_environment": True,  # accept `.test`
    # Headers are written 7-bit (email.policy.SMTP), which has no form for a non-ASCII
    # local part; internationalised domains are fine and are kept in their IDNA form.
    "allow_smtputf8": False,
}


class AddressError(ValidationError):
    """An address (or a header value) broke a rule; names the field and the rule."""


def check_header_value(value: str, *, field: str) -> str:
    """Return `value` unchanged, or raise ValidationError if it could inject a header.

    Refuses line breaks and NUL as raw characters and also as RFC 2047 encoded-words
    (`=?utf-8?q?a=0D=0Ab?=`) and percent escapes (`%0d%0a`), since some software decodes
    those before writing a header. Other control characters (except tab) are refused too.
    """
    if not isinstance(value, str):
        raise ValidationError(field, f"must be a string, not {type(value).__name__}")
    if value.isascii() and value.isprintable() and "%" not in value and "=?" not in value:
        # Printable ASCII with nothing to decode: no line break in any form. Most values
        # (addresses, Message-IDs, subjects) are such, and are checked several times.
        return value
    return _check_header_value_strictly(value, field)


def _check_header_value_strictly(value: str, field: str) -> str:
    for text in _decodings(value, field):
        if isinstance(text, bytes):
            if _BREAK_BYTES.intersection(text):
                raise ValidationError(field, INJECTION_RULE)
        elif _LINE_BREAKS.intersection(text):
            raise ValidationError(field, INJECTION_RULE)
    if _CONTROLS.intersection(value):
        raise ValidationError(field, "must not contain control characters")
    # An unpaired surrogate (a byte of a command line that was not UTF-8) has no form in a
    # header: writing the message raised UnicodeEncodeError.
    return checked_text(value, field)


# Pure, and called for the same From address on every message a worker sends: a cache
# spares the strict parse (email-validator) on the hot path. Errors are not cached.
@functools.lru_cache(maxsize=4096)
def parse_address(value: str, *, field: str) -> Address:
    """Parse exactly one mailbox; return it with the domain lower-cased (IDNA for non-ASCII).

    A display name holding a comma or another special character must be quoted:
    `"Müller, Jürgen" <j@example.com>`; unquoted, it would read as two addresses.
    """
    try:
        check_header_value(value, field=field)
    except ValidationError as exc:
        raise AddressError(exc.field, exc.rule) from None
    text = value.strip()
    if not text:
        raise AddressError(field, "must not be empty")
    match = _ANGLE.fullmatch(text)
    if match:
        name, spec = _display_name(match["name"], value, field), match["addr"].strip()
    elif "<" in text or ">" in text:
        raise AddressError(field, f"{value!r}: expected 'Name <user@example.com>'")
    elif text.count("@") > 1 and ("," in text or ";" in text):
        raise AddressError(field, f"{value!r}: one address per string (pass a list)")
    else:
        name, spec = "", text
    local, domain = _check_addr_spec(spec, value, field)
    return Address(display_name=name, username=local, domain=domain)


def parse_addresses(value: str | Sequence[str] | None, *, field: str) -> tuple[Address, ...]:
    """Parse a list of addresses, one per string; a single string is one address.

    A single string is never split on commas (a quoted display name may hold one); pass a
    list for several recipients. None, an empty string or an empty list give ().
    """
    if value is None:
        return ()
    if isinstance(value, str):
        return (parse_address(value, field=field),) if value.strip() else ()
    if not isinstance(value, Sequence):
        raise AddressError(field, "must be a string or a list of strings")
    return tuple(parse_address(item, field=f"{field}[{i}]") for i, item in enumerate(value))


def _display_name(raw: str, value: str, field: str) -> str:
    raw = raw.strip()
    quoted = _QUOTED.fullmatch(raw)
    if quoted:
        name = re.sub(r"\\(.)", r"\1", quoted["text"], flags=re.DOTALL)
    else:
        bad = sorted(_SPECIALS.intersection(raw))
        if "@" in bad or "<" in bad:
            raise AddressError(field, f"{value!r}: one address per string (pass a list)")
        if bad:
            chars = " ".join(repr(c) for c in bad)
            raise AddressError(field, f"the display name {raw!r} holds {chars}: put it in "
                                      'double quotes ("Name, Title" <user@example.com>)')
        name = " ".join(raw.split())
    if "=?" in name:
        try:
            name = str(email.header.make_header(email.header.decode_header(name)))
        except (HeaderParseError, LookupError, UnicodeDecodeError):
            raise AddressError(field, f"the display name {raw!r} has a malformed "
                                      "encoded-word") from None
    # Checked once decoded: a mail client shows what an encoded-word holds.
    return check_display_name(unicodedata.normalize("NFC", name), field=field)


def check_display_name(name: str, *, field: str) -> str:
    """Return `name`, or raise AddressError naming `field` and each bidirectional
    embedding, override or isolate it holds (U+202A-U+202E, U+2066-U+2069).

    The directional marks U+200E, U+200F and U+061C are allowed."""
    if name.isascii():
        return name
    found = sorted(BIDI_CONTROLS.intersection(name))
    if found:
        names = ", ".join(f"U+{ord(c):04X} {unicodedata.name(c)}" for c in found)
        raise AddressError(field, f"the display name {name!r} holds {names}: a display name "
                                  "must not hold bidirectional embeddings, overrides or "
                                  "isolates (U+202A-U+202E, U+2066-U+2069), which reorder "
                                  "what mail clients show; the marks U+200E, U+200F and "
                                  "U+061C are allowed")
    return name


def _check_addr_spec(spec: str, value: str, field: str) -> tuple[str, str]:
    """(ASCII local part, ASCII domain) of `spec`, or AddressError naming `field`.

    A simple address takes a shortcut: its domain's verdict is cached (a worker sees the
    same few domains all day, and the domain is most of email-validator's work), and its
    local part is one email-validator returns unchanged. Everything else, and every
    refusal, goes through email-validator whole, so the errors are its own."""
    local, at, domain = spec.rpartition("@")
    if (at and len(local) <= _LOCAL_MAX and _SIMPLE_LOCAL.fullmatch(local)
            and _SIMPLE_DOMAIN.fullmatch(domain)):
        verdict = _domain_verdict(domain)
        if verdict is not None and len(local) + 1 + verdict[1] <= ADDRESS_MAX:
            return local, verdict[0]
    return _check_addr_spec_strictly(spec, value, field)


@functools.lru_cache(maxsize=1024)
def _domain_verdict(domain: str) -> tuple[str, int] | None:
    """(the ASCII domain, the longest of its forms in octets) as email-validator judges
    `domain` after a plain local part, or None if it refuses it. Pure: safe to cache."""
    try:
        checked, ascii_domain = _validated(f"a@{domain}")
    except EmailNotValidError:
        return None
    forms = (domain, ascii_domain, checked.domain)
    return ascii_domain, max(len(form.encode("utf-8")) for form in forms)


def _check_addr_spec_strictly(spec: str, value: str, field: str) -> tuple[str, str]:
    try:
        checked, ascii_domain = _validated(spec)
    except EmailNotValidError as exc:
        raise AddressError(field, f"{value!r} is not a valid email address: {exc}") from None
    local = checked.ascii_local_part
    assert local is not None  # allow_smtputf8 is off: every accepted local part is ASCII
    return local, ascii_domain


def _validated(spec: str) -> tuple[email_validator.ValidatedEmail, str]:
    """email-validator's verdict on `spec`, and its ASCII domain (special-use kept)."""
    domain = spec.rpartition("@")[2].lower()
    special = _special_use_suffix(domain)
    probe = spec
    if special:
        # email-validator refuses special-use names (localhost, .local, .invalid, ...) with
        # no option to allow them short of editing its module-wide list. Deliverability is
        # the SMTP server's call, so check the syntax with a same-shaped stand-in suffix.
        probe = spec[: len(spec) - len(special)] + re.sub(r"[^.]", "x", special)
    checked = validate_email(probe, **_VALIDATOR_OPTIONS)  # type: ignore[arg-type]
    ascii_domain = checked.ascii_domain
    if special:
        ascii_domain = ascii_domain[: len(ascii_domain) - len(special)] + special
    return checked, ascii_domain


def _special_use_suffix(domain: str) -> str | None:
    for name in email_validator.SPECIAL_USE_DOMAIN_NAMES:
        if domain == name or domain.endswith("." + name):
            return name
    return None


def _decodings(value: str, field: str) -> Iterator[str | bytes]:
    """The value as written, with its encoded-words decoded, and percent-decoded."""
    decoded = _ENCODED_WORD.sub(lambda m: _decode_word(m, field), value)
    for text in (value, decoded):
        yield text
        for _ in range(3):  # a few rounds, so that `%250d` (double-encoded) is seen too
            if "%" not in text:
                break
            raw = unquote_to_bytes(text)
            yield raw
            text = raw.decode("utf-8", errors="replace")
            yield text


def _decode_word(match: re.Match[str], field: str) -> str:
    charset, encoding, payload = match[1].split("*")[0], match[2].lower(), match[3]
    try:
        if encoding == "q":
            data = re.sub(rb"=([0-9A-Fa-f]{2})", lambda m: bytes([int(m[1], 16)]),
                          payload.replace("_", " ").encode("ascii"))
        else:
            data = base64.b64decode(payload + "=" * (-len(payload) % 4))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        # Mail readers decode leniently; a word we cannot decode cannot be proven harmless.
        raise ValidationError(field, "holds a malformed encoded-word") from None
    if _BREAK_BYTES.intersection(data):
        raise ValidationError(field, INJECTION_RULE)
    try:
        return data.decode(charset, errors="replace")
    except LookupError:  # unknown charset: the byte check above already ran
        return data.decode("latin-1")


def stored_form(address: str) -> str:
    """An address as the email log and the suppression list keep it: lower case, its domain
    in IDNA form as parse_address gives it. One that names an internationalized domain in
    Unicode (a report per RFC 6533, an operator's command line) is otherwise another
    address; one whose domain postrelay could not have sent to is lower-cased only."""
    address = address.lower()
    local, at, domain = address.rpartition("@")
    if domain.isascii() or not at:
        return address
    try:
        ascii_domain = parse_address(f"a@{domain}", field="address").domain
    except ValidationError:
        return address
    return f"{local}@{ascii_domain.lower()}"
