"""The dashboard's sign-in session: a signed, HttpOnly, SameSite=Strict cookie.

The cookie never holds a key. It holds who signed in — the service role, or the id of a
tenant API key — an expiry and a random nonce, signed with HMAC-SHA256 under a key derived
from the service-role key. Rotating the service-role key therefore ends every session. A
tenant session is checked against `mdm.aa_api_key` on every request (see web.py), so
revoking the key ends it at once.

The CSRF token of a session is an HMAC of its nonce: a page's forms carry it in a hidden
field and every POST is refused without it. Sign-in has its own token, bound to a nonce in
a short-lived cookie, so a third-party page cannot sign a browser in either.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from uuid import UUID

SESSION_COOKIE = "postrelay_dashboard"
LOGIN_COOKIE = "postrelay_dashboard_login"
SESSION_SECS = 8 * 3600
LOGIN_SECS = 3600
_VERSION = "v1"


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in browser. `key_id` None: the service role (every tenant)."""

    key_id: UUID | None
    tenant_id: UUID | None
    nonce: str
    expires: int


class Signer:
    """Signs and checks session cookies and CSRF tokens with keys derived from one secret."""

    def __init__(self, service_role_key: bytes) -> None:
        # Separate derived keys per purpose: a cookie signature is never a valid CSRF token.
        self._cookie_key = _derive(service_role_key, b"postrelay.dashboard.cookie.v1")
        self._csrf_key = _derive(service_role_key, b"postrelay.dashboard.csrf.v1")
        self._notice_key = _derive(service_role_key, b"postrelay.dashboard.notice.v1")

    def new_session(self, key_id: UUID | None, tenant_id: UUID | None,
                    now: float | None = None) -> Session:
        expires = int((now if now is not None else time.time()) + SESSION_SECS)
        return Session(key_id, tenant_id, secrets.token_hex(16), expires)

    def dump(self, session: Session) -> str:
        body = {"kid": str(session.key_id) if session.key_id else None,
                "tid": str(session.tenant_id) if session.tenant_id else None,
                "n": session.nonce, "exp": session.expires}
        payload = _b64(json.dumps(body, separators=(",", ":")).encode())
        return f"{_VERSION}.{payload}.{self._mac(payload)}"

    def load(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session in `cookie`, or None when it is missing, forged, malformed or expired."""
        if not cookie:
            return None
        version, _, rest = cookie.partition(".")
        payload, _, mac = rest.partition(".")
        if version != _VERSION or not _same(mac, self._mac(payload)):
            return None
        try:
            body = json.loads(_unb64(payload))
            session = Session(UUID(body["kid"]) if body["kid"] else None,
                              UUID(body["tid"]) if body["tid"] else None,
                              str(body["n"]), int(body["exp"]))
        except (ValueError, KeyError, TypeError):
            return None
        if (session.key_id is None) != (session.tenant_id is None):
            return None
        if session.expires <= (now if now is not None else time.time()):
            return None
        return session

    def csrf_token(self, nonce: str) -> str:
        return _b64(hmac.new(self._csrf_key, nonce.encode(), hashlib.sha256).digest())

    def csrf_ok(self, nonce: str, token: str | None) -> bool:
        return bool(token) and _same(self.csrf_token(nonce), token or "")

    def login_nonce(self) -> str:
        """A fresh sign-in nonce for the login cookie: `login:<expiry>:<random>`."""
        return f"login:{int(time.time()) + LOGIN_SECS}:{secrets.token_hex(16)}"

    def login_ok(self, nonce: str | None, token: str | None) -> bool:
        if not nonce or not nonce.startswith("login:"):
            return False
        try:
            expires = int(nonce.split(":")[1])
        except (IndexError, ValueError):
            return False
        return expires > time.time() and self.csrf_ok(nonce, token)

    def notice_mac(self, notice: str) -> str:
        """The signature of a notice a redirect carries to the page it sends to."""
        return _b64(hmac.new(self._notice_key, notice.encode("utf-8", "surrogatepass"),
                             hashlib.sha256).digest())

    def notice_ok(self, notice: str, mac: str) -> bool:
        return bool(mac) and _same(self.notice_mac(notice), mac)

    def _mac(self, payload: str) -> str:
        return _b64(hmac.new(self._cookie_key, payload.encode(), hashlib.sha256).digest())


def _same(expected: str, presented: str) -> bool:
    """`hmac.compare_digest` on the UTF-8 bytes: given two str, it raises TypeError when one
    holds a non-ASCII character, and a token or a cookie is whatever the browser sent."""
    return hmac.compare_digest(expected.encode("utf-8", "surrogatepass"),
                               presented.encode("utf-8", "surrogatepass"))


def _derive(secret: bytes, purpose: bytes) -> bytes:
    return hmac.new(secret, purpose, hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
