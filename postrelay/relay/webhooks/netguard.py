"""Refuse webhook requests to loopback, private, link-local and other non-public addresses.

A tenant's endpoint URL is untrusted input: without this guard, anyone who may add an
endpoint can make the worker POST into the internal network (SSRF), e.g. to a cloud
metadata service on 169.254.169.254. The host is resolved once, every resolved address is
checked, and the request then goes to the checked address (the URL keeps its host name for
the Host header and TLS), so a DNS answer that changes between check and connect (DNS
rebinding) cannot slip through.

An IPv6 address that embeds an IPv4 address is judged as the IPv4 address it embeds (as
well as on its own): IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d` (such as
`::7f00:1`), IPv4-translated `::ffff:0:a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`
and Teredo `2001::/32` (server and client). The local-use NAT64 prefix `64:ff9b:1::/48`
puts the IPv4 address where its operator chose, so the whole prefix is refused, and so is
the deprecated site-local `fec0::/10`, which `ipaddress` still counts as global.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass

from postrelay.queue import PermanentError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# No `ipaddress` property exists for these (the others use .ipv4_mapped, .sixtofour, .teredo,
# .is_site_local): RFC 4291 2.5.5.1 (compatible), RFC 2765 (translated), RFC 6052 (NAT64).
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215: IPv4 position unknown


class AddressRefused(PermanentError):
    """The endpoint resolves to an address that webhooks may not reach."""


@dataclass(frozen=True, slots=True)
class Target:
    host: str  # as in the URL
    addresses: tuple[IPAddress, ...]  # every one checked; tried in order, as resolved


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """Every IPv4 address `ip` embeds, in any of the forms the module docstring lists."""
    found: list[ipaddress.IPv4Address] = []
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip in _IPV4_COMPATIBLE or ip in _IPV4_TRANSLATED or ip in _NAT64:
        found.append(low32)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)  # (server, client): either one is where the traffic goes
    return found


def is_public(ip: IPAddress) -> bool:
    """Whether `ip` is a public unicast address; an IPv6 address that embeds an IPv4
    address is public only if every IPv4 address it embeds is public too."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.is_site_local or ip in _NAT64_LOCAL:
            return False
        if not all(is_public(v4) for v4 in embedded_ipv4(ip)):
            return False
    return ip.is_global and not ip.is_multicast


async def resolve(host: str, port: int, *, allow_private: bool) -> Target:
    """Resolve `host`; raise AddressRefused if any address is not public (unless allowed).

    `host` is the URL's host in its ASCII form (IDNA-encoded, as the HTTP client sends it):
    a Unicode name would be encoded again by the resolver, by other rules (IDNA 2003).
    A resolution failure raises OSError (socket.gaierror): usually temporary, so retried.
    """
    literal = host.strip("[]")
    try:
        addresses: list[IPAddress] = [ipaddress.ip_address(literal)]
    except ValueError:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        # sockaddr[0] may carry an IPv6 zone ("fe80::1%eth0"): the address is before the %.
        addresses = list(dict.fromkeys(
            ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos))
    if not addresses:
        raise socket.gaierror(f"{host}: no addresses")
    if not allow_private:
        # Every address, not just the first: a name with one public and one private
        # address would otherwise reach the private one on a retry or a fallback.
        refused = [str(ip) for ip in addresses if not is_public(ip)]
        if refused:
            raise AddressRefused(
                f"{host} resolves to a non-public address ({', '.join(refused)}); "
                "set POSTRELAY_WEBHOOK_ALLOW_PRIVATE=true to allow it")
    return Target(host, tuple(addresses))
