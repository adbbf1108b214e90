"""Standard Webhooks signing (https://www.standardwebhooks.com).

The secret is `whsec_` + base64 of a random key. Each attempt signs
`{webhook-id}.{webhook-timestamp}.{body}` with HMAC-SHA256 keyed by the decoded key, and
sends `webhook-signature: v1,<base64 signature>`. The body is signed as the exact bytes that
go on the wire: re-serialising JSON on either side would break the signature.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

from postrelay.core.errors import ValidationError

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32  # the spec asks for 24 to 64 bytes


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def secret_key(secret: str) -> bytes:
    """The HMAC key inside a `whsec_…` secret."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise ValidationError("secret", f"must start with {SECRET_PREFIX!r}")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except binascii.Error:
        raise ValidationError("secret", "must be whsec_ followed by base64") from None
    if not 24 <= len(key) <= 64:
        raise ValidationError("secret", "the key must be 24 to 64 bytes long")
    return key


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value for one attempt."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
        "content-type": "application/json",
    }
