"""A bound on failed authentication: per client address and for the whole process.

Both the API (a request whose key is neither the service-role key nor a live tenant key)
and the dashboard's sign-in form count their failures here, in one throttle per `postrelay
api` process: they check the same keys, so an attacker gains nothing by using both.

The rules, over a sliding window (`POSTRELAY_AUTH_FAILURE_WINDOW_SECS`, 60 s):

- **Per client.** A client with `POSTRELAY_AUTH_FAILURES_PER_CLIENT` (10) failures in the
  window is refused with 429 and `Retry-After` until the oldest of them leaves the window,
  before its key is looked at, whatever key it sends: a refusal that checked the key would
  tell a guess that is right from one that is wrong. A client is its IPv4 address, or the
  /64 network of its IPv6 address (one host usually holds a whole /64).
- **Overall.** Once the process has seen `POSTRELAY_AUTH_FAILURES_TOTAL` (100) failures in
  the window, from any clients, every client is refused the same way — except a client
  that authenticated successfully within the last hour and has failed not once in the
  window. So an attacker spread over many addresses gets at most that many guesses per
  window, and a correct key is locked out by failures from other addresses only while the
  overall bound is exhausted, and only at an address that has not just been using it
  (a new client, or one that has itself just failed).
- Failures are counted only when a key was presented and checked: a request without a
  key, with a malformed header, or refused by the throttle adds nothing.
- **A key counts once.** The same wrong key sent again from the same client within the
  window is not another guess: it adds nothing to either bound. A service retrying a
  revoked key, or a provider's webhook with an outdated password, would otherwise lock
  out every client behind the same address (a NAT, a cluster's egress) and, past the
  overall bound, every new client; each distinct key still counts.

The state is in memory, per process: several API processes (or a restart) each allow
these numbers. Behind a reverse proxy every client has the proxy's address unless
`POSTRELAY_API_FORWARDED_ALLOW_IPS` names the proxy, whose X-Forwarded-For is then used.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from postrelay.core.settings import Settings

TRUST_SECS = 3600.0  # a success keeps an address exempt from the overall bound this long
MAX_TRUSTED = 10_000  # addresses remembered as trusted (the oldest are forgotten first)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a client is refused now, and in how many whole seconds it may try again."""

    retry_after: int
    overall: bool  # the overall bound (else this client's own)

    @property
    def message(self) -> str:
        who = ("this installation has seen too many failed authentication attempts"
               if self.overall else "too many failed authentication attempts from this address")
        return f"{who}; try again in {self.retry_after} s"


def client_key(host: str | None) -> str:
    """The unit the per-client bound counts: an IPv4 address, or an IPv6 address's /64
    (an IPv4-mapped IPv6 address counts as the IPv4 address)."""
    if not host:
        return "unknown"
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{ip}/64", strict=False))
    return str(ip)


class AuthThrottle:
    """Thread-safe (the API's key checks run in its threadpool)."""

    def __init__(self, *, per_client: int = 10, total: int = 100, window_secs: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if per_client < 1 or total < 1 or window_secs <= 0:
            raise ValueError("per_client and total must be at least 1, window_secs positive")
        self.per_client = per_client
        self.total = total
        self.window = float(window_secs)
        self._clock = clock
        self._lock = threading.Lock()
        # client -> {fingerprint of a wrong key -> when it last failed}, oldest first
        self._failures: dict[str, OrderedDict[bytes, float]] = {}
        self._all: deque[float] = deque(maxlen=total)
        self._trusted: OrderedDict[str, float] = OrderedDict()  # client -> last success
        self._swept = clock()

    def check(self, host: str | None) -> Refusal | None:
        """None if `host` may have its key checked now, else the refusal to answer."""
        client = client_key(host)
        with self._lock:
            now = self._clock()
            self._expire(now)
            mine = self._failures.get(client)
            if mine is not None:
                while mine and next(iter(mine.values())) <= now - self.window:
                    mine.popitem(last=False)
                if len(mine) >= self.per_client:
                    return self._refusal(next(iter(mine.values())), now, overall=False)
            if len(self._all) >= self.total and not self._is_trusted(client, mine, now):
                return self._refusal(self._all[0], now, overall=True)
            return None

    def failed(self, host: str | None, key: str | bytes) -> None:
        """`key` (as presented) was checked and was wrong. Only a digest of it is kept."""
        client = client_key(host)
        raw = key.encode("utf-8", "surrogatepass") if isinstance(key, str) else key
        fingerprint = hashlib.sha256(raw).digest()
        with self._lock:
            now = self._clock()
            mine = self._failures.setdefault(client, OrderedDict())
            again = fingerprint in mine and mine[fingerprint] > now - self.window
            mine[fingerprint] = now
            mine.move_to_end(fingerprint)
            while len(mine) > self.per_client:  # two checks passed at once: keep the bound
                mine.popitem(last=False)
            if not again:
                self._all.append(now)

    def succeeded(self, host: str | None) -> None:
        client = client_key(host)
        with self._lock:
            self._trusted[client] = self._clock()
            self._trusted.move_to_end(client)
            while len(self._trusted) > MAX_TRUSTED:
                self._trusted.popitem(last=False)

    def _is_trusted(self, client: str, mine: OrderedDict[bytes, float] | None,
                    now: float) -> bool:
        last = self._trusted.get(client)
        return last is not None and now - last <= TRUST_SECS and not mine

    def _refusal(self, oldest: float, now: float, *, overall: bool) -> Refusal:
        return Refusal(max(1, math.ceil(oldest + self.window - now)), overall)

    def _expire(self, now: float) -> None:
        horizon = now - self.window
        while self._all and self._all[0] <= horizon:
            self._all.popleft()
        if now - self._swept < self.window:
            return
        # Once per window: forget clients whose failures all left it, and old successes.
        self._swept = now
        for client in [c for c, keys in self._failures.items()
                       if not keys or next(reversed(keys.values())) <= horizon]:
            del self._failures[client]
        while self._trusted and next(iter(self._trusted.values())) <= now - TRUST_SECS:
            self._trusted.popitem(last=False)


def auth_throttle(settings: Settings) -> AuthThrottle:
    """The throttle the settings describe: one per `postrelay api` process, shared by the API
    and the dashboard's sign-in."""
    return AuthThrottle(per_client=settings.auth_failures_per_client,
                        total=settings.auth_failures_total,
                        window_secs=settings.auth_failure_window_secs)
