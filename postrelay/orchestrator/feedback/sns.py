"""Amazon SNS messages to an HTTPS endpoint: signature verification and the subscription
handshake.

    sns = SnsVerifier(topics={"arn:aws:sns:eu-west-1:123456789012:ses-feedback"},
                      tolerance_secs=7200)
    sns.verify(message)      # WebhookAuthError unless SNS signed it, for one of our topics,
                             # with a Timestamp within 7200 s of this host's clock
    sns.confirm(message)     # a SubscriptionConfirmation: fetch its SubscribeURL

The signature (SignatureVersion 1: RSA with SHA-1, 2: with SHA-256) is checked with the
certificate at SigningCertURL, fetched only over HTTPS from a host the pattern allows
(default `sns.<region>.amazonaws.com`) and cached, or with a certificate pinned from a local
file. A valid signature proves only that SNS sent the message, and anyone can have SNS send
to this endpoint from a topic of their own: the topic must be one of ours too. A message
whose Timestamp (when SNS took it, signed, and the same in every retry) is further from this
host's clock than the tolerance is refused: a captured message would otherwise be taken
whenever it is replayed.
"""

from __future__ import annotations

import base64
import binascii
import re
import ssl
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from postrelay.core.errors import ConfigError, ValidationError
from postrelay.orchestrator.feedback.webhook import (
    WebhookAuthError,
    WebhookUnavailableError,
    check_fresh,
    field,
    iso_time,
)

# `sns.<region>.amazonaws.com`: a region's shape (us-east-1, cn-north-1, us-gov-west-1),
# not any name, which took `sns.s3.amazonaws.com`, a storage bucket anyone may own.
DEFAULT_HOSTS = r"sns\.[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d{1,2}\.amazonaws\.com(\.cn)?"
# What each type of message signs, in this order ("Subject" only when present).
SIGNED = {
    "Notification": ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    "SubscriptionConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token",
                                 "TopicArn", "Type"),
    "UnsubscribeConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token",
                                "TopicArn", "Type"),
}
HASHES = {"1": hashes.SHA1, "2": hashes.SHA256}
# A topic's ARN as SNS writes it in TopicArn: `arn:<partition>:sns:<region>:<account>:<name>`.
TOPIC_ARN = re.compile(r"arn:[a-z-]+:sns:[a-z0-9-]+:\d+:[\w.-]+")
CACHE_SIZE = 32
TOLERANCE_SETTING = "POSTRELAY_FEEDBACK_SES_TOLERANCE_SECS"
FETCH_TIMEOUT_SECS = 10.0
MAX_CERT_BYTES = 64 * 1024


class SnsVerifier:
    def __init__(self, topics: set[str], *, tolerance_secs: float,
                 host_pattern: str = DEFAULT_HOSTS, pinned_cert: Path | None = None,
                 ca_file: Path | None = None) -> None:
        if not topics:
            raise ConfigError("POSTRELAY_FEEDBACK_SES_TOPIC_ARNS: at least one topic ARN")
        for topic in sorted(topics):
            if not TOPIC_ARN.fullmatch(topic):
                # The topic's name alone (`ses-feedback`) matched no TopicArn: every
                # message and the subscription handshake were refused once running.
                raise ConfigError(f"POSTRELAY_FEEDBACK_SES_TOPIC_ARNS: {topic!r} is not a "
                                  "topic ARN (arn:aws:sns:<region>:<account>:<name>)")
        if not host_pattern.strip():
            # Set but empty (`VAR=` in a compose file): it allowed no host, and every
            # message was refused once running, the subscription handshake with them.
            raise ConfigError("POSTRELAY_FEEDBACK_SES_CERT_HOSTS: empty, so no host would "
                              "be allowed; unset it for SNS's own hosts")
        try:
            self._hosts = re.compile(host_pattern, re.IGNORECASE)
        except re.error as exc:
            raise ConfigError(f"POSTRELAY_FEEDBACK_SES_CERT_HOSTS: not a pattern: {exc}") \
                from None
        self.topics = frozenset(topics)
        self.tolerance_secs = tolerance_secs
        self._pinned = _pinned(pinned_cert) if pinned_cert else None
        self._verify_tls: ssl.SSLContext | bool = True
        if ca_file is not None:
            try:
                self._verify_tls = ssl.create_default_context(cafile=str(ca_file))
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"POSTRELAY_FEEDBACK_SES_CA_FILE: {exc}") from None
        self._cache: dict[str, tuple[rsa.RSAPublicKey, datetime]] = {}
        self._lock = threading.Lock()

    def verify(self, message: Mapping[str, Any], *, now: float | None = None) -> None:
        """WebhookAuthError unless `message` is signed by SNS, from one of our topics, and
        its Timestamp within the tolerance of `now` (this host's clock); ValidationError
        naming the field for a message that is not an SNS message."""
        kind = field(message, "Type", str, "")
        if kind not in SIGNED:
            raise ValidationError("Type", f"must be one of {', '.join(SIGNED)}")
        version = field(message, "SignatureVersion", str, "")
        if version not in HASHES:
            raise WebhookAuthError(f"SignatureVersion {version!r} is not 1 or 2")
        if field(message, "TopicArn", str, "") not in self.topics:
            raise WebhookAuthError("TopicArn is not one of POSTRELAY_FEEDBACK_SES_TOPIC_ARNS")
        for name in SIGNED[kind]:
            field(message, name, str, "", required=name != "Subject")
        # Signed with the rest, and the same in every retry of a delivery. Before the
        # signature: a replay is refused without fetching a certificate or an RSA check.
        signed_at = iso_time(message["Timestamp"], "Timestamp")
        assert signed_at is not None  # a required field
        check_fresh("Timestamp", signed_at.timestamp(), time.time() if now is None else now,
                    self.tolerance_secs, TOLERANCE_SETTING)
        signed = "".join(f"{name}\n{message[name]}\n" for name in SIGNED[kind]
                         if message.get(name) is not None)
        try:
            signature = base64.b64decode(field(message, "Signature", str, ""), validate=True)
        except (binascii.Error, ValueError):
            raise WebhookAuthError("Signature is not base64") from None
        key = self._pinned or self._fetched(field(message, "SigningCertURL", str, ""))
        try:
            # surrogatepass: JSON may escape half a surrogate pair, which no signature
            # SNS made covers; encoded as it is, it verifies as nothing (401), not a 500.
            key.verify(signature, signed.encode("utf-8", "surrogatepass"), padding.PKCS1v15(),
                       HASHES[version]())
        except InvalidSignature:
            raise WebhookAuthError("the signature does not verify") from None

    def confirm(self, message: Mapping[str, Any]) -> None:
        """Confirm a verified SubscriptionConfirmation by fetching its SubscribeURL, only
        from an allowed host."""
        url = field(message, "SubscribeURL", str, "")
        self._allowed(url, "SubscribeURL")
        self._get(url, "SubscribeURL", "confirming the subscription", read=False)

    def _fetched(self, url: str) -> rsa.RSAPublicKey:
        self._allowed(url, "SigningCertURL")
        if not urlsplit(url).path.endswith(".pem"):  # as SNS names its certificates
            raise WebhookAuthError("SigningCertURL is not a .pem certificate's")
        with self._lock:
            cached = self._cache.get(url)
            if cached is not None and datetime.now(UTC) <= cached[1]:
                return cached[0]
            # Expired since it was fetched: fetched again, and refused unless SNS serves a
            # certificate valid now at that URL (a cached one was used for ever).
            self._cache.pop(url, None)
        pem = self._get(url, "SigningCertURL", "fetching the signing certificate")
        try:
            key, not_after = _public_key(pem)
        except ConfigError as exc:
            raise WebhookAuthError(str(exc)) from None
        with self._lock:
            if len(self._cache) >= CACHE_SIZE:  # SNS rotates certificates rarely
                self._cache.pop(next(iter(self._cache)))
            self._cache[url] = (key, not_after)
        return key

    def _get(self, url: str, name: str, doing: str, *, read: bool = True) -> bytes:
        """The body at `url` (when `read`), at most MAX_CERT_BYTES of it: read as it comes,
        so that an answer without end is refused rather than held in memory until the
        connection drops. WebhookUnavailableError when the host cannot answer now."""
        body = bytearray()
        try:
            with httpx.stream("GET", url, timeout=FETCH_TIMEOUT_SECS, verify=self._verify_tls,
                              follow_redirects=False) as response:
                response.raise_for_status()
                for chunk in response.iter_bytes() if read else ():
                    body += chunk
                    if len(body) > MAX_CERT_BYTES:
                        raise WebhookAuthError(f"{name}: the answer is larger than "
                                               f"{MAX_CERT_BYTES} bytes")
        except httpx.InvalidURL:  # a URL the client cannot send, from whoever made it
            raise WebhookAuthError(f"{name} is not a URL that can be fetched") from None
        except httpx.HTTPError as exc:
            raise WebhookUnavailableError(f"{doing} failed: {exc}") from None
        return bytes(body)

    def _allowed(self, url: str, name: str) -> None:
        refused = WebhookAuthError(f"{name} is not an https URL on an allowed host "
                                   "(POSTRELAY_FEEDBACK_SES_CERT_HOSTS)")
        try:
            parts = urlsplit(url)
            port = parts.port  # ValueError when out of range or not a number
        except ValueError:  # `https://[abc/`: no URL at all, from whoever sent it
            raise refused from None
        if parts.scheme != "https" or not self._hosts.fullmatch(parts.hostname or "") \
                or parts.username or parts.password or port == 0:
            raise refused


def _pinned(path: Path) -> rsa.RSAPublicKey:
    try:
        return _public_key(path.read_bytes())[0]
    except (OSError, ConfigError) as exc:
        raise ConfigError(f"POSTRELAY_FEEDBACK_SES_CERT_FILE: {exc}") from None


def _public_key(pem: bytes) -> tuple[rsa.RSAPublicKey, datetime]:
    """The certificate's RSA key, and the time it is valid until."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise ConfigError(f"the SNS signing certificate is not a PEM certificate: {exc}") \
            from None
    now = datetime.now(UTC)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise ConfigError("the SNS signing certificate is not valid now")
    key = cert.public_key()
    if not isinstance(key, rsa.RSAPublicKey):
        raise ConfigError("the SNS signing certificate's key is not RSA")
    return key, cert.not_valid_after_utc
