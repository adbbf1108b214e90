"""Refuse webhook requests to loopback, private, link-local and other non-public addresses.

A tenant's endpoint URL is untrusted input: without this guard, anyone who may add an
endpoint can make the worker POST into the internal network (SSRF), e.g. to a cloud
metadata service on 169.254.169.254. The host is resolved once, every resolved address is
checked, and the request then goes to the checked address (the URL keeps its host name for
the Host header and TLS), so a DNS answer that changes between check and connect (DNS
rebinding) cannot slip through.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass

from postrelay.queue import PermanentError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class AddressRefused(PermanentError):
    """The endpoint resolves to an address that webhooks may not reach."""


@dataclass(frozen=True, slots=True)
class Target:
    host: str  # as in the URL
    addresses: tuple[IPAddress, ...]  # every one checked; tried in order, as resolved


def is_public(ip: IPAddress) -> bool:
    """Whether `ip` is a public unicast address, looking inside IPv6 forms that embed an
    IPv4 address (mapped, 6to4, Teredo, NAT64) so that none of them reaches 127.0.0.1."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None and not is_public(embedded):
            return False
    return ip.is_global and not ip.is_multicast


async def resolve(host: str, port: int, *, allow_private: bool) -> Target:
    """Resolve `host`; raise AddressRefused if any address is not public (unless allowed).

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
