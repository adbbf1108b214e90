"""One-click unsubscribe (RFC 8058): signed links naming tenant, recipient and category.

    links = UnsubscribeLinks("https://mail.acme.example", secret)
    links.headers(tenant_id, "ann@example.com", "newsletter")
    # {"List-Unsubscribe": "<https://mail.acme.example/u/…>",
    #  "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"}
    links.verify(token)          # (tenant_id, "ann@example.com", "newsletter")

With a bounce domain (`UnsubscribeLinks(url, secret, "bounces.acme.example")`) the header
also offers `<mailto:unsubscribe@bounces.acme.example?subject=unsubscribe%20<token>>`,
which `postrelay inbound` reads (mailto.py).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
from typing import TYPE_CHECKING
from urllib.parse import urlsplit
from uuid import UUID

from postrelay.core.errors import ConfigError, ValidationError
from postrelay.orchestrator.feedback.verp import feedback_keys, previous_secret

if TYPE_CHECKING:
    from postrelay.core.settings import Settings

MAC_BYTES = 16
MAILTO_LOCAL = "unsubscribe"


class UnsubscribeTokenError(ValidationError):
    def __init__(self, rule: str) -> None:
        super().__init__("token", rule)


class UnsubscribeLinks:
    def __init__(self, public_url: str, secret: bytes, mailto_domain: str | None = None,
                 previous: bytes | None = None) -> None:
        url = public_url.rstrip("/")
        if not url.isascii() or any(c.isspace() for c in url):
            # RFC 2369 puts the link in the header as it is: one a reader cannot take out
            # of its angle brackets (RFC 2047 words, a blank) is no link.
            raise ValidationError("public_url", "must be ASCII without blanks (an "
                                                "internationalized host in its xn-- form)")
        parts = urlsplit(url)
        if parts.scheme != "https" and not (parts.scheme == "http"
                                             and _loopback(parts.hostname or "")):
            raise ValidationError("public_url", "must be https:// (plain http only for a "
                                                "loopback host)")
        try:
            port_ok = parts.port is None or parts.port > 0
        except ValueError:  # out of range, or not a number
            port_ok = False
        # The link is the base, `/u/` and the token: after a query or a fragment the token
        # is no part of the path, and a user and password would go into every mail.
        if parts.query or parts.fragment or "@" in parts.netloc or not parts.hostname \
                or not port_ok:
            raise ValidationError("public_url", "must be scheme, host, an optional port and "
                                                "path: no user, query or fragment")
        self.base = url
        # With a bounce domain, the links also offer `mailto:unsubscribe@<domain>` with the
        # token in the subject (a local part is too short for it, and may be case-folded).
        self.mailto_address = f"{MAILTO_LOCAL}@{mailto_domain}" if mailto_domain else None
        # Links in mail signed with the previous secret still unsubscribe (verify).
        self._keys = feedback_keys(secret, previous, "unsubscribe")

    @classmethod
    def from_settings(cls, settings: Settings) -> UnsubscribeLinks | None:
        """None unless POSTRELAY_PUBLIC_URL and POSTRELAY_FEEDBACK_SECRET are both set; the
        mailto: address when POSTRELAY_EMAIL_BOUNCE_DOMAIN is set too."""
        if not settings.public_url or not settings.feedback_secret:
            return None
        domain = settings.email_bounce_domain.strip().lower().rstrip(".") \
            if settings.email_bounce_domain else None
        try:
            return cls(settings.public_url, settings.feedback_secret.get_secret_value().encode(),
                       domain, previous_secret(settings))
        except ValidationError as exc:
            raise ConfigError(f"POSTRELAY_{exc.field.upper()}: {exc.rule}") from None

    def token(self, tenant_id: UUID, recipient: str, category: str) -> str:
        body = tenant_id.bytes + f"{recipient.lower()}\0{category}".encode()
        return f"{_b64(body)}.{_b64(self._mac(self._keys[0], body))}"

    def verify(self, token: str) -> tuple[UUID, str, str]:
        body_text, _, mac_text = token.partition(".")
        try:
            body, mac = _unb64(body_text), _unb64(mac_text)
        except (binascii.Error, ValueError):
            raise UnsubscribeTokenError("not a token postrelay made") from None
        if len(body) < 18 or not any(hmac.compare_digest(mac, self._mac(key, body))
                                     for key in self._keys):
            raise UnsubscribeTokenError("the signature does not match (tampered or forged)")
        recipient, _, category = body[16:].decode("utf-8", "replace").partition("\0")
        return UUID(bytes=body[:16]), recipient, category

    def url(self, tenant_id: UUID, recipient: str, category: str) -> str:
        return f"{self.base}/u/{self.token(tenant_id, recipient, category)}"

    def mailto(self, tenant_id: UUID, recipient: str, category: str) -> str | None:
        if self.mailto_address is None:
            return None
        return (f"mailto:{self.mailto_address}?subject=unsubscribe%20"
                f"{self.token(tenant_id, recipient, category)}")

    def headers(self, tenant_id: UUID, recipient: str, category: str) -> dict[str, str]:
        uris = [f"<{self.url(tenant_id, recipient, category)}>"]
        mailto = self.mailto(tenant_id, recipient, category)
        if mailto is not None:
            uris.append(f"<{mailto}>")
        return {"List-Unsubscribe": ", ".join(uris),
                "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"}

    @staticmethod
    def _mac(key: bytes, body: bytes) -> bytes:
        return hmac.new(key, body, hashlib.sha256).digest()[:MAC_BYTES]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(raw) != text:
        raise ValueError("not the canonical spelling")
    return raw


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
