"""The VERP return path: an envelope sender on the bounce domain that names the log row.

    path = ReturnPath("bounces.acme.example", b"a long random secret")
    path.address(log_id)       # 'bounce-<token>@bounces.acme.example'
    path.log_id(address)       # log_id again; TokenError for a token postrelay did not sign

Given the secret before (`previous`), its tokens are still taken while mail it signed can
come back; new ones are signed with `secret`.

The token is the log row's id and an HMAC-SHA256 of it (80 bits), in base32 so it survives
receivers that change the case of a local part: a bounce to it can only be about a message
postrelay sent, and nobody without the secret can make one about another message.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from typing import TYPE_CHECKING
from uuid import UUID

from postrelay.core.errors import ConfigError, ValidationError

if TYPE_CHECKING:
    from postrelay.core.settings import Settings

PREFIX = "bounce-"
MAC_BYTES = 10
TOKEN_BYTES = 16 + MAC_BYTES  # the log row's id, then its MAC
TOKEN_CHARS = -(-TOKEN_BYTES * 8 // 5)  # in base32, unpadded
MIN_SECRET = 16
# Tokens remembered as verified, per ReturnPath, the oldest forgotten first: the receiver's
# parser meets a token after as many others as its inbox holds (a few MB at most).
VERIFIED_KEPT = 16384
# RFC 4648 base32 read through int() (token_bytes): base64's codec is written in Python,
# and cost the receiver more than the HMAC at every RCPT. int() writes base 32 with the
# digits 0-9 and then A-V.
_BASE32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_AS_INT_DIGITS = str.maketrans(_BASE32, "0123456789ABCDEFGHIJKLMNOPQRSTUV")
_BASE32_TEXT = re.compile(f"[{_BASE32}]*")
_UNUSED_BITS = TOKEN_CHARS * 5 - TOKEN_BYTES * 8  # of the last character
_DOMAIN = re.compile(r"(?=.{1,253}$)([a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)"
                     r"(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)+")


class TokenError(ValidationError):
    """An address on the bounce domain whose token postrelay did not sign."""

    def __init__(self, rule: str) -> None:
        super().__init__("verp_token", rule)


def feedback_key(secret: bytes, purpose: str) -> bytes:
    """A key for one use of the feedback secret (VERP, unsubscribe), so a token made for
    one can never pass for the other."""
    return hmac.new(secret, f"postrelay feedback {purpose}".encode(), hashlib.sha256).digest()


def feedback_keys(secret: bytes, previous: bytes | None, purpose: str) -> tuple[bytes, ...]:
    """The keys a token for `purpose` may be signed with: the secret's, which signs, then
    the previous secret's, while mail it signed still comes back. ValidationError for a
    secret too short to sign with."""
    for field, value in (("feedback_secret", secret), ("feedback_secret_previous", previous)):
        if value is not None and len(value) < MIN_SECRET:
            raise ValidationError(field, f"at least {MIN_SECRET} characters")
    return tuple(feedback_key(value, purpose) for value in (secret, previous) if value)


def previous_secret(settings: Settings) -> bytes | None:
    """POSTRELAY_FEEDBACK_SECRET_PREVIOUS, when set."""
    previous = settings.feedback_secret_previous
    return previous.get_secret_value().encode() if previous else None


class ReturnPath:
    def __init__(self, domain: str, secret: bytes, previous: bytes | None = None) -> None:
        domain = domain.strip().lower().rstrip(".")
        if not _DOMAIN.fullmatch(domain):
            raise ValidationError("email_bounce_domain",
                                  f"{domain!r} is not an ASCII domain name")
        self.domain = domain
        self._keys = feedback_keys(secret, previous, "verp")
        # The receiver checks a token at RCPT and its parser again: the second check is a
        # lookup. Only tokens that passed are kept, so a flood of forged ones cannot evict.
        self._verified: dict[str, UUID] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> ReturnPath | None:
        """None without POSTRELAY_EMAIL_BOUNCE_DOMAIN (envelope sender = From, as before);
        ConfigError when the domain is set without a usable POSTRELAY_FEEDBACK_SECRET."""
        if not settings.email_bounce_domain:
            return None
        secret = settings.feedback_secret.get_secret_value() if settings.feedback_secret else ""
        if len(secret) < MIN_SECRET:
            raise ConfigError("POSTRELAY_FEEDBACK_SECRET: required when "
                              "POSTRELAY_EMAIL_BOUNCE_DOMAIN is set, at least "
                              f"{MIN_SECRET} characters")
        try:
            return cls(settings.email_bounce_domain, secret.encode(), previous_secret(settings))
        except ValidationError as exc:
            raise ConfigError(f"POSTRELAY_{exc.field.upper()}: {exc.rule}") from None

    def address(self, log_id: UUID) -> str:
        raw = log_id.bytes + self._mac(self._keys[0], log_id.bytes)
        token = base64.b32encode(raw).decode().rstrip("=").lower()
        return f"{PREFIX}{token}@{self.domain}"

    def is_ours(self, address: str) -> bool:
        """Whether `address` is on the bounce domain (signed or not)."""
        return address.rpartition("@")[2].strip().lower().rstrip(".") == self.domain

    def log_id(self, address: str) -> UUID:
        """The log row a VERP address names; TokenError when it is not one of ours."""
        known = self._verified.get(address)
        if known is not None:
            return known
        ident = self._verify(address)
        if len(self._verified) >= VERIFIED_KEPT:
            del self._verified[next(iter(self._verified))]
        self._verified[address] = ident
        return ident

    def _verify(self, address: str) -> UUID:
        local, _, domain = address.strip().strip("<>").rpartition("@")
        if domain.lower().rstrip(".") != self.domain:
            raise TokenError(f"not an address on {self.domain}")
        if not local.lower().startswith(PREFIX):
            raise TokenError(f"the local part does not start with {PREFIX!r}")
        raw = token_bytes(local[len(PREFIX):].upper())
        ident, mac = raw[:16], raw[16:]
        if not any(hmac.compare_digest(mac, self._mac(key, ident)) for key in self._keys):
            raise TokenError("the token's signature does not match (tampered or forged)")
        return UUID(bytes=ident)

    @staticmethod
    def _mac(key: bytes, ident: bytes) -> bytes:
        return hmac.new(key, ident, hashlib.sha256).digest()[:MAC_BYTES]


def token_bytes(token: str) -> bytes:
    """The bytes an upper-case token spells, as base64.b32decode reads them; TokenError for
    a token that base64.b32encode would not have written."""
    if not _BASE32_TEXT.fullmatch(token):
        raise TokenError("the token is not base32")
    if len(token) != TOKEN_CHARS:
        raise TokenError("the token has the wrong length or spelling")
    bits = int(token.translate(_AS_INT_DIGITS), 32)
    if bits & ((1 << _UNUSED_BITS) - 1):  # unused bits set: one spelling per token
        raise TokenError("the token has the wrong length or spelling")
    return (bits >> _UNUSED_BITS).to_bytes(TOKEN_BYTES, "big")
