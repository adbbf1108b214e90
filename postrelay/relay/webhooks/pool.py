"""Keep-alive connections for webhook deliveries: idle connections kept per target.

A delivery used to open a connection of its own (TCP, and TLS for https) and close it after
the answer, so a receiver that gets thousands of events paid a handshake for each, and so
did the worker. Each connection is now an httpx client of one connection; a delivery takes
an idle one of its target's (the latest used), or makes one, and gives it back after its
answer, within the bounds below.

A target is (scheme, host name, port, checked IP address, TLS context):
- the address, because every delivery connects to the address the guard checked for it
  (netguard.py): a name that now resolves elsewhere gets another client, never a connection
  to its old address, and a name that now resolves to a refused address gets nothing;
- the host name, because TLS was negotiated for it (SNI and the certificate check);
- the TLS context, because an endpoint's private CA must not vouch for a connection that a
  default-trust endpoint then uses, or the other way round (trust.py caches one context per
  CA, so endpoints of one CA share). The key holds the context itself: its identity cannot
  be taken by another context while the key lives.
Every request a client sends has the same origin, so httpcore's own rules decide whether
its connection is reused, and what they guarantee holds: an idle connection is closed
instead of reused once its keep-alive has expired or once its socket is readable (an idle
HTTP/1.1 connection that is readable was closed by the server), and a new one is opened;
nothing had been sent on it. A request that fails after it was written (the server closed
the connection as it went out) is not sent again: it fails the attempt, which the job
retries later.

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
from dataclasses import dataclass, field

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
# One connection per client: httpcore's pool looks at every one of its connections (a
# poll of each socket, and a count of them all per connection) whenever a request starts
# or ends, so a client shared by fifty deliveries in flight cost more than the
# connections it saved. Each client here holds one, and idle clients wait in a stack.
_ONE_CONNECTION = 1


@dataclass(frozen=True, slots=True)
class TargetKey:
    scheme: str
    host: str  # the URL's host name, as TLS sends and checks it
    port: int
    address: IPAddress  # the address the guard checked for this delivery
    context: ssl.SSLContext  # compared by identity


@dataclass(slots=True)
class _Target:
    idle: list[httpx.AsyncClient] = field(default_factory=list)  # the latest used last
    last_used: float = 0.0
    users: int = 0


class DeliveryClients:
    """Single-connection httpx clients per TargetKey: a delivery takes an idle one (the
    latest used) or makes one, and gives it back after its answer; at most
    `idle_per_target` wait per target, for at most `targets` targets, each target kept
    while used within `keepalive_secs`. `idle_per_target=0` keeps none: each connection is
    closed after its answer."""

    def __init__(self, *, keepalive_secs: float = KEEPALIVE_SECS,
                 idle_per_target: int = IDLE_PER_TARGET, targets: int = TARGETS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.keepalive_secs = keepalive_secs
        self.idle_per_target = idle_per_target
        self.limits = httpx.Limits(max_connections=_ONE_CONNECTION,
                                   max_keepalive_connections=_ONE_CONNECTION,
                                   keepalive_expiry=keepalive_secs)
        self.targets = targets
        self._clock = clock
        self._targets: OrderedDict[TargetKey, _Target] = OrderedDict()  # least recent first
        self._closed = False

    def __len__(self) -> int:
        return len(self._targets)

    @asynccontextmanager
    async def client(self, key: TargetKey) -> AsyncIterator[httpx.AsyncClient]:
        """A client of the target, held for the block (close the response inside it). One
        left by a failure is closed, not given back."""
        target = self._targets.get(key)
        if target is None:
            target = self._targets[key] = _Target()
        self._targets.move_to_end(key)
        target.users += 1
        target.last_used = self._clock()
        client = target.idle.pop() if target.idle else httpx.AsyncClient(
            # Redirects are not followed; no proxy or certificate setting from the
            # environment; `verify` is the endpoint's context (trust.py).
            follow_redirects=False, trust_env=False, verify=key.context, limits=self.limits)
        kept = False
        try:
            await self._close(self._surplus(key))
            yield client
            kept = not self._closed and len(target.idle) < self.idle_per_target
        finally:
            target.users -= 1
            target.last_used = self._clock()
            if kept and self._targets.get(key) is target:
                target.idle.append(client)
            else:
                await client.aclose()

    async def close(self) -> None:
        """Close every idle connection; one in use is closed when its delivery ends."""
        self._closed = True
        await self._close(list(self._targets))

    def _surplus(self, using: TargetKey) -> list[TargetKey]:
        """Targets unused for keepalive_secs (httpcore would close their connections only
        at their next request, which may never come), and the least recently used ones
        past `targets`; never the one in use now."""
        stale_before = self._clock() - self.keepalive_secs
        surplus: list[TargetKey] = []
        for key, target in self._targets.items():  # least recently used first
            over = len(self._targets) - len(surplus) > self.targets
            if key != using and (over or target.users == 0 and target.last_used < stale_before):
                surplus.append(key)
        return surplus

    async def _close(self, keys: list[TargetKey]) -> None:
        idle = []
        for key in keys:
            idle.extend(self._targets.pop(key).idle)
        for client in idle:
            await client.aclose()
