"""Webhook endpoint URLs: checked and normalised once, when an endpoint is added, so that
what is stored is exactly what a delivery requests."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

import httpx

from postrelay.core.errors import ValidationError
from postrelay.relay.webhooks.netguard import IPAddress, is_public

MAX_URL_LENGTH = 2048


def validate_url(url: str, *, allow_private: bool = False) -> str:
    """The URL as it is stored and requested: an absolute http(s) URL, normalised by the
    HTTP client's own parser (httpx), so that what `webhooks add` accepts is exactly what a
    delivery sends to. Raises ValidationError("url", ...) for anything httpx cannot parse
    or that another parser (the resolver, a browser) could read differently:

    - the scheme is http or https; no credentials (`user@`), no `#fragment`, no backslash;
    - the port, when given, is a decimal number from 1 to 65535 without leading zeros;
    - the host is a DNS name (letters, digits, `-`, `_`; a Unicode name is stored in its
      IDNA form), a dotted-quad IPv4 address (`127.0.0.1`, never `0177.0.0.1`, `127.1`,
      `0x7f.0.0.1` or `2130706433`, which resolvers read as other addresses) or a
      bracketed IPv6 address without a zone;
    - unless `allow_private` (POSTRELAY_WEBHOOK_ALLOW_PRIVATE), an IP address must be
      public by the delivery's address guard (netguard.is_public: IPv4 embedded in IPv6
      is judged as IPv4), and `localhost` names are refused. Names are resolved, and
      checked again, at every delivery.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValidationError("url", "must be a non-empty http:// or https:// URL")
    url = url.strip()
    if len(url) > MAX_URL_LENGTH:
        raise ValidationError("url", f"must be at most {MAX_URL_LENGTH} characters")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise ValidationError("url", "must not contain whitespace or control characters")
    if "\\" in url:
        raise ValidationError("url", "must not contain a backslash (parsers disagree on it)")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ValidationError("url", f"is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValidationError("url", "the scheme must be http or https")
    if "@" in parts.netloc:
        # They would be shown by `webhooks list` and logged with every failure.
        raise ValidationError("url", "must not contain credentials (user:password@)")
    if parts.fragment or "#" in url:
        raise ValidationError("url", "must not contain a #fragment")
    host_text, port_text = _split_authority(parts.netloc)
    if not host_text:
        raise ValidationError("url", "must name a host")
    if port_text is not None and not (_PORT.fullmatch(port_text) and int(port_text) <= 65535):
        raise ValidationError("url", f"is not a valid URL: the port {port_text!r} must be a "
                                     "decimal number from 1 to 65535, without leading zeros")
    try:
        parsed = httpx.URL(parts.scheme + url[len(parts.scheme):])  # the scheme lower-cased
    except (httpx.InvalidURL, ValueError, UnicodeError) as exc:
        raise ValidationError("url", f"is not a valid URL: {exc}") from None
    host = parsed.raw_host.decode("ascii")
    address = _host_address(host_text, host)
    if not allow_private:
        if address is not None and not is_public(address):
            raise ValidationError("url", f"{host_text} is not a public address; set "
                                         "POSTRELAY_WEBHOOK_ALLOW_PRIVATE=true to allow it")
        if address is None and (host.rstrip(".") == "localhost"
                                or host.rstrip(".").endswith(".localhost")):
            raise ValidationError("url", f"{host} is a loopback name; set "
                                         "POSTRELAY_WEBHOOK_ALLOW_PRIVATE=true to allow it")
    normalised = str(parsed)
    if len(normalised) > MAX_URL_LENGTH:
        raise ValidationError("url", f"must be at most {MAX_URL_LENGTH} characters once "
                                     "normalised")
    return normalised


_PORT = re.compile(r"[1-9][0-9]{0,4}")
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")


def _split_authority(netloc: str) -> tuple[str, str | None]:
    """(host, port text or None) of an authority without userinfo, as written."""
    if netloc.startswith("["):
        host, bracket, rest = netloc.partition("]")
        if not bracket:
            raise ValidationError("url", "an IPv6 address must end with ']'")
        host += "]"
    else:
        host, _, rest = netloc.partition(":")
        rest = ":" + rest if _ else ""
    if not rest:
        return host, None
    if not rest.startswith(":"):
        raise ValidationError("url", f"unexpected {rest!r} after the host")
    return host, rest[1:]


def _host_address(written: str, host: str) -> IPAddress | None:
    """The IP address the host is, or None for a DNS name; ValidationError for a host the
    resolver would read as an address httpx does not (or as none at all)."""
    if written.startswith("["):
        literal = host.strip("[]")
        if "%" in literal:
            raise ValidationError("url", "an IPv6 address must not carry a zone (%...)")
        try:
            return ipaddress.IPv6Address(literal)
        except ValueError:
            raise ValidationError("url", f"{written} is not a valid IPv6 address") from None
    name = host.lower()
    labels = name[:-1].split(".") if name.endswith(".") else name.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        # A name never ends in a numeric label: this is an IPv4 address, which must be
        # written the one way every parser reads alike.
        try:
            return ipaddress.IPv4Address(name)
        except ValueError:
            raise ValidationError("url", f"{written!r} is not a valid IPv4 address: write it "
                                         "as four decimal numbers 0-255 (a.b.c.d), without "
                                         "leading zeros") from None
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValidationError("url", f"{written!r} is not a valid host name")
    return None
