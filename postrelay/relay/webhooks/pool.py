"""Keep-alive connections for webhook deliveries: one httpx client per target.

A delivery used to open a connection of its own (TCP, and TLS for https) and close it after
the answer, so a receiver that gets thousands of events paid a handshake for each, and so
did the worker. Deliveries to the same target now share one httpx client, whose httpcore
pool keeps connections open between them, within the bounds below.

A target is (scheme, host name, port, checked IP address, TLS context):
- the address, because every delivery connects to the address the guard checked for it
  (netguard.py): a name that now resolves elsewhere gets another client, never a connection
  to its old address, and a name that now resolves to a refused address gets nothing;
- the host name, because TLS was negotiated for it (SNI and the certificate check);
- the TLS context, because an endpoint's private CA must not vouch for a connection that a
  default-trust endpoint then uses, or the other way round (trust.py caches one context per
  CA, so endpoints of one CA share). The key holds the context itself: its identity cannot
  be taken by another context while the key lives.
Every request a client sends has the same origin, so httpcore's own rules are all that
decide reuse, and what they guarantee holds: an idle connection is closed instead of reused
once its keep-alive has expired or once its socket is readable (an idle HTTP/1.1 connection
that is readable was closed by the server), and a new one is opened; nothing had been sent
on it. A request that fails after it was written (the server closed the connection as it
went out) is not sent again: it fails the attempt, which the job retries later.

    clients = DeliveryClients()
    async with clients.client(TargetKey("https", "example.com", 443, address, context)) as c:
        response = await c.send(request, stream=True)
    await clients.close()    # at the worker's stop: the registry's closer
"""

from __future__ import annotations

import ssl
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx

from postrelay.relay.webhooks.netguard import IPAddress

# Receivers close idle connections on their own clocks (nginx after 75 s, Node after 5 s);
# httpcore notices those before reuse. This bounds what the worker keeps: a connection idle
# longer is closed rather than reused.
KEEPALIVE_SECS = 60.0
# Idle connections kept per target: enough for the default worker concurrency (10) to send
# a wave of deliveries to one receiver on open connections. A busier target opens the rest
# anew, without waiting (no cap on connections in use, as before).
IDLE_PER_TARGET = 10
# Targets kept; past it the least recently used one's connections are closed. With
# IDLE_PER_TARGET it bounds a worker's idle sockets to 500, well inside the usual limit of
# 1024 descriptors with the database pool beside them.
TARGETS = 50


@dataclass(frozen=True, slots=True)
class TargetKey:
    scheme: str
    host: str  # the URL's host name, as TLS sends and checks it
    port: int
    address: IPAddress  # the address the guard checked for this delivery
    context: ssl.SSLContext  # compared by identity


@dataclass(slots=True)
class _Entry:
    client: httpx.AsyncClient
    last_used: float
    users: int = 0
    retired: bool = False  # out of the pool: closed when its last user leaves


class DeliveryClients:
    """One httpx client per TargetKey, kept while used within `keepalive_secs`, at most
    `targets` of them, each keeping at most `idle_per_target` idle connections.
    `idle_per_target=0` keeps none: each connection is closed after its answer."""

    def __init__(self, *, keepalive_secs: float = KEEPALIVE_SECS,
                 idle_per_target: int = IDLE_PER_TARGET, targets: int = TARGETS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.keepalive_secs = keepalive_secs
        self.limits = httpx.Limits(max_connections=None,
                                   max_keepalive_connections=idle_per_target,
                                   keepalive_expiry=keepalive_secs)
        self.targets = targets
        self._clock = clock
        self._entries: OrderedDict[TargetKey, _Entry] = OrderedDict()
        self._closed = False

    def __len__(self) -> int:
        return len(self._entries)

    @asynccontextmanager
    async def client(self, key: TargetKey) -> AsyncIterator[httpx.AsyncClient]:
        """The target's client, held for the block (close the response inside it)."""
        entry = self._entries.get(key)
        if entry is None:
            # Redirects are not followed; no proxy or certificate setting from the
            # environment; `verify` is the endpoint's context (trust.py).
            client = httpx.AsyncClient(follow_redirects=False, trust_env=False,
                                       verify=key.context, limits=self.limits)
            entry = _Entry(client, self._clock())
            if not self._closed:
                self._entries[key] = entry
            else:  # a delivery after close(): served, then closed, not kept
                entry.retired = True
        else:
            self._entries.move_to_end(key)
        entry.users += 1
        try:
            await self._retire(self._surplus())
            yield entry.client
        finally:
            entry.users -= 1
            entry.last_used = self._clock()
            if entry.retired and entry.users == 0:
                await entry.client.aclose()

    async def close(self) -> None:
        """Close every idle connection; one in use is closed when its delivery ends."""
        self._closed = True
        await self._retire(list(self._entries))

    def _surplus(self) -> list[TargetKey]:
        """Targets unused for keepalive_secs (httpcore would close their connections only
        at their next request, which may never come), and the least recently used ones
        past `targets`."""
        stale_before = self._clock() - self.keepalive_secs
        surplus = [key for key, entry in self._entries.items()
                   if entry.users == 0 and entry.last_used < stale_before]
        over = len(self._entries) - len(surplus) - self.targets
        if over > 0:
            kept = (key for key in self._entries if key not in surplus)
            surplus.extend(next(kept) for _ in range(over))
        return surplus

    async def _retire(self, keys: list[TargetKey]) -> None:
        idle = []
        for key in keys:
            entry = self._entries.pop(key)
            entry.retired = True
            if entry.users == 0:
                idle.append(entry.client)
        for client in idle:
            await client.aclose()
