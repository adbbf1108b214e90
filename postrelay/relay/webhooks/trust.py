"""A webhook endpoint's private certificate authority: checked once when it is given, then
turned into one cached TLS context per CA for deliveries.

An endpoint behind an internal CA stores that CA's certificates (PEM text) in its row, so a
worker on any host verifies it without a file. Its deliveries trust that CA *instead of*
the default bundle: the operator named who may vouch for this receiver, and a public CA
(or a certificate mis-issued by one) must not vouch for it too. This is how
POSTRELAY_SMTP_CA_FILE and POSTRELAY_FEEDBACK_SES_CA_FILE trust their bundles. The host name
is checked as for any HTTPS endpoint; there is no way to switch verification off.

    pem = validate_ca_pem(open("internal-ca.pem").read())   # ValidationError("ca_pem", ...)
    contexts = CaContexts()
    httpx.AsyncClient(verify=contexts.get(pem))
"""

from __future__ import annotations

import re
import ssl
from collections import OrderedDict
from datetime import UTC, datetime

import httpx
from cryptography import x509

from postrelay.core.errors import ValidationError
from postrelay.queue import PermanentError

# A CA bundle of a few certificates is some kilobytes; this bounds what a row may carry.
MAX_CA_PEM_CHARS = 64 * 1024
CACHED_CONTEXTS = 64  # distinct CAs kept per worker; far more than endpoints usually use
_PEM_LABEL = re.compile(r"^-----BEGIN ([A-Z0-9 ]+)-----\s*$", re.MULTILINE)


class BadEndpointCa(PermanentError):
    """The endpoint's stored CA cannot be loaded (edited in the database): not retried,
    nothing was sent."""


def validate_ca_pem(pem: str, *, field: str = "ca_pem", now: datetime | None = None) -> str:
    """The CA certificates of `pem` as they are stored: each one PEM-encoded again from what
    Python's ssl loaded, so the row holds nothing else (no comments, no keys).

    Raises ValidationError(field, ...) unless `pem` is ASCII text of at most
    MAX_CA_PEM_CHARS characters holding only `CERTIFICATE` blocks, at least one, each of
    which ssl loads as a certificate authority (basicConstraints CA:TRUE, or self-signed)
    that is valid at `now` (default: the current time): between its notBefore and notAfter.
    """
    if not isinstance(pem, str) or not pem.strip():
        raise ValidationError(field, "must hold at least one PEM CA certificate "
                                     "(-----BEGIN CERTIFICATE-----)")
    if len(pem) > MAX_CA_PEM_CHARS:
        raise ValidationError(field, f"must be at most {MAX_CA_PEM_CHARS} characters of PEM")
    if not pem.isascii():
        raise ValidationError(field, "must be PEM text (ASCII); a DER file needs "
                                     "`openssl x509 -inform der` first")
    labels = _PEM_LABEL.findall(pem)
    if not labels:
        raise ValidationError(field, "must hold at least one PEM CA certificate "
                                     "(-----BEGIN CERTIFICATE-----)")
    others = sorted(set(labels) - {"CERTIFICATE"})
    if others:
        # A private key next to the certificate would otherwise be stored in the row.
        raise ValidationError(field, f"must hold only CERTIFICATE blocks, found "
                                     f"{', '.join(others)}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cadata=pem)
    except ssl.SSLError as exc:
        raise ValidationError(field, f"must be PEM CA certificates Python's ssl can load; "
                                     f"ssl says: {exc.reason or exc}") from None
    stats = context.cert_store_stats()
    if stats["x509"] != stats["x509_ca"]:
        count = stats["x509"] - stats["x509_ca"]
        raise ValidationError(field, f"must hold CA certificates only; {count} of them is "
                                     "not a CA (a server's own certificate?): give the CA "
                                     "that signed it")
    ders = context.get_ca_certs(binary_form=True)
    for der in ders:
        _check_validity(der, field, now or datetime.now(UTC))
    return "".join(ssl.DER_cert_to_PEM_cert(der) for der in ders)


def _check_validity(der: bytes, field: str, now: datetime) -> None:
    """ValidationError unless the certificate is valid at `now`. ssl loads an expired CA
    without a word, and every delivery through it would then fail verification."""
    try:
        cert = x509.load_der_x509_certificate(der)
        not_before, not_after = cert.not_valid_before_utc, cert.not_valid_after_utc
    except ValueError as exc:  # ssl loaded it, so this is unlikely; refuse rather than store
        raise ValidationError(field, f"must be CA certificates whose validity can be read: "
                                     f"{exc}") from None
    if now > not_after:
        raise ValidationError(field, f"the CA certificate {_subject(cert)} expired on "
                                     f"{_when(not_after)} (notAfter): give one valid now")
    if now < not_before:
        raise ValidationError(field, f"the CA certificate {_subject(cert)} is not valid before "
                                     f"{_when(not_before)} (notBefore): give one valid now")


def _subject(cert: x509.Certificate) -> str:
    """The certificate's subject as one short line of printable ASCII: it goes into an error
    that a terminal or a browser shows, and its text is the certificate maker's."""
    try:
        subject = cert.subject.rfc4514_string()
    except ValueError:
        subject = "?"
    safe = "".join(ch if ch.isascii() and ch.isprintable() else "?" for ch in subject)
    return repr(safe[:120] + ("..." if len(safe) > 120 else ""))


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def ca_context(pem: str) -> ssl.SSLContext:
    """A client context that trusts the CAs of `pem` and nothing else, and checks the host
    name. BadEndpointCa if `pem` does not load."""
    if not pem.strip():
        # create_default_context(cadata="") would load the default bundle instead.
        raise BadEndpointCa("the endpoint's stored CA is empty")
    try:
        return ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=pem)
    except (ssl.SSLError, TypeError, ValueError) as exc:
        raise BadEndpointCa(f"the endpoint's stored CA cannot be loaded ({exc}); set it "
                            "again with `postrelay webhooks set-ca`") from None


class CaContexts:
    """One TLS context per distinct CA, the least recently used dropped past `size`, and
    the default bundle's: loading a bundle and building a context costs more than many a
    delivery (an httpx client left to build its own loads certifi's bundle each time, for
    a plain-HTTP endpoint too)."""

    def __init__(self, size: int = CACHED_CONTEXTS) -> None:
        self.size = size
        self._contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()
        self._default: ssl.SSLContext | None = None

    def default(self) -> ssl.SSLContext:
        """The context of an endpoint without a private CA: httpx's own default."""
        if self._default is None:
            self._default = httpx.create_ssl_context(verify=True, trust_env=False)
        return self._default

    def get(self, pem: str) -> ssl.SSLContext:
        context = self._contexts.get(pem)
        if context is None:
            context = self._contexts[pem] = ca_context(pem)
            if len(self._contexts) > self.size:
                self._contexts.popitem(last=False)
        else:
            self._contexts.move_to_end(pem)
        return context
