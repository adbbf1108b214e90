"""The relay's in-memory directory of enabled webhook endpoints.

Routes are plain synchronous functions that run inside the relay's batch without a
connection, so the webhook route cannot query endpoints per event. Instead every relay
process keeps this directory: it loads all enabled endpoints (id, tenant, filter) on start,
reloads them every `refresh_secs` (1 s), and at once when NOTIFY postrelay_webhooks arrives
(every endpoint change sends it at commit).

The reloads keep the snapshot close; what makes it exact is `catch_up`, the webhook route's
`prepare`: in each relay batch's transaction, after the claim, one statement counts the
enabled endpoints and sums their (id, row version) hashes, and a snapshot that differs is reloaded
there and then, before any event of the batch is routed. An endpoint change that
committed before an event did is therefore seen by that event's routing, whether or not
the NOTIFY came first (behind a transaction pooler there is none, and a reload waits up to
`refresh_secs`): relayed by the older snapshot, an event emitted just after an endpoint was
added or enabled got no delivery for it, and a replay did not help once the event was
handled. A change that commits after the batch's check may or may not reach the batch's
events; they committed before it. If the directory has neither reloaded nor been checked
for `max_stale_secs`, the route raises instead of routing on old data, so the relay
retries those events with backoff rather than mis-route them.
"""

from __future__ import annotations

import asyncio
import fnmatch
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.dbcall import driver_fetch
from postrelay.core.errors import PostrelayError
from postrelay.core.listener import Listener
from postrelay.core.service import periodic
from postrelay.relay.webhooks.endpoints import WEBHOOK_SQL

WEBHOOKS_CHANNEL = "postrelay_webhooks"


class DirectoryNotReady(PostrelayError):  # noqa: N818 - reads as the state it reports
    """The directory has not loaded yet, or its snapshot is too old to route by."""


@dataclass(frozen=True, slots=True)
class EndpointFilter:
    id: UUID
    tenant_id: UUID
    event_types: tuple[str, ...]  # empty: every event type

    def matches(self, event_type: str) -> bool:
        return not self.event_types or any(
            fnmatch.fnmatchcase(event_type, pattern) for pattern in self.event_types
        )


class EndpointDirectory:
    """The snapshot; `run_once` reloads it, every `refresh_secs` and when NOTIFY wakes it."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        listen_url: str | None = None,
        refresh_secs: float = 1.0,
        max_stale_secs: float = 30.0,
    ) -> None:
        _positive_secs("refresh_secs", refresh_secs)
        _positive_secs("max_stale_secs", max_stale_secs)
        if max_stale_secs < refresh_secs:
            # Between two good reloads the snapshot would count as too old: every event
            # the webhook route sees (every event: it matches "*") would fail, then die.
            raise ValueError(f"max_stale_secs: must be at least refresh_secs "
                             f"({refresh_secs:g}), got {max_stale_secs:g}")
        self.engine = engine
        self.refresh_secs = refresh_secs
        self.max_stale_secs = max_stale_secs
        self._by_tenant: dict[UUID, tuple[EndpointFilter, ...]] = {}
        self._loaded_at: float | None = None  # time.monotonic() of the last good load
        # (enabled endpoints, sum of their (id, row version) hashes) of the snapshot, as
        # webhook_endpoint_directory_version counts them; None before the first load.
        self._version: tuple[int, int] | None = None
        # One load at a time, so that a snapshot is never replaced by an older one.
        self._lock = asyncio.Lock()
        self.loads = 0  # snapshots loaded, for tests and metrics
        # After a failed reload, the next is a refresh later: the last snapshot serves
        # until then, and matching() refuses it once it is too old.
        self._loop = periodic("webhook_directory", self.run_once, refresh_secs,
                              first_wait=refresh_secs)  # start() loads the first snapshot
        self._listener = (
            Listener(listen_url, WEBHOOKS_CHANNEL, self._loop.wake.set) if listen_url else None
        )

    def matching(self, tenant_id: UUID, event_type: str) -> list[EndpointFilter]:
        """The tenant's enabled endpoints whose filter accepts `event_type`."""
        if self._loaded_at is None:
            raise DirectoryNotReady("the webhook endpoint directory has not loaded yet")
        age = time.monotonic() - self._loaded_at
        if age > self.max_stale_secs:
            raise DirectoryNotReady(f"the webhook endpoint directory is {age:.0f} s old")
        return [e for e in self._by_tenant.get(tenant_id, ()) if e.matches(event_type)]

    async def run_once(self) -> int:
        """Reload the snapshot; returns how many enabled endpoints it holds."""
        async with self._lock:
            # Note the time before reading: a change committed during the read is then
            # judged by a snapshot no younger than the read's start.
            started = time.monotonic()
            async with self.engine.connect() as conn:
                rows = (await conn.execute(WEBHOOK_SQL["webhook_endpoint_directory"])).all()
            self._load(rows, started)
        return len(rows)

    async def catch_up(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Make the snapshot at least as new as what `conn`'s transaction (a relay batch,
        after its claim) sees of the endpoints: one statement when it is, a reload on
        `conn` when it is not. The webhook route's `prepare` (route.py)."""
        started = time.monotonic()
        ((endpoints, versions),) = await driver_fetch(
            conn, WEBHOOK_SQL["webhook_endpoint_directory_version"], {})
        async with self._lock:
            if self._version == (endpoints, int(versions)) and self._loaded_at is not None:
                # As good as a load made when the count was: it matched.
                self._loaded_at = max(self._loaded_at, started)
                return
            started = time.monotonic()
            rows = await driver_fetch(conn, WEBHOOK_SQL["webhook_endpoint_directory"], {})
            self._load(rows, started)

    def _load(self, rows: Sequence[Sequence[Any]], started: float) -> None:
        by_tenant: dict[UUID, list[EndpointFilter]] = {}
        for endpoint_id, tenant_id, event_types, _ in rows:
            by_tenant.setdefault(tenant_id, []).append(
                EndpointFilter(endpoint_id, tenant_id, tuple(event_types or ())))
        self._by_tenant = {t: tuple(es) for t, es in by_tenant.items()}  # one atomic swap
        self._version = (len(rows), sum(row[3] for row in rows))
        self._loaded_at = started
        self.loads += 1

    @property
    def ready(self) -> bool:
        return self._loaded_at is not None

    async def start(self) -> None:
        """Load once (raising if the database is unreachable), then keep reloading."""
        await self.run_once()
        if self._listener is not None:
            self._listener.start()
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        if self._listener is not None:
            await self._listener.stop()


def _positive_secs(name: str, value: object) -> None:
    """A finite number of seconds above 0: a refresh of 0 reloaded without pause, NaN
    broke the loop's waits."""
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not 0 < value < float("inf")):  # NaN fails the comparison
        raise ValueError(f"{name}: must be a number of seconds, more than 0 and finite, "
                         f"got {value!r}")
