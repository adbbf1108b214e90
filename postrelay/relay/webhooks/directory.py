"""The relay's in-memory directory of enabled webhook endpoints.

Routes are plain synchronous functions that run inside the relay's batch without a
connection, so the webhook route cannot query endpoints per event. Instead every relay
process keeps this directory: it loads all enabled endpoints (id, tenant, filter) on start,
reloads them every `refresh_secs` (1 s), and at once when NOTIFY postrelay_webhooks arrives
(every endpoint change sends it at commit).

Staleness window: a change is seen within milliseconds when LISTEN works, and within
`refresh_secs` otherwise. An event relayed inside that window is routed by the previous
snapshot: a just-added endpoint may miss it, and a just-disabled or removed one may get a
job, which the handler then stops without sending (it reads the endpoint again). If the
directory cannot reload for `max_stale_secs`, the route raises instead of routing on old
data, so the relay retries those events with backoff rather than mis-route them.
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncEngine

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
        # Note the time before reading: a change committed during the read is then
        # judged by a snapshot no younger than the read's start.
        started = time.monotonic()
        async with self.engine.connect() as conn:
            rows = (await conn.execute(WEBHOOK_SQL["webhook_endpoint_directory"])).all()
        by_tenant: dict[UUID, list[EndpointFilter]] = {}
        for endpoint_id, tenant_id, event_types in rows:
            by_tenant.setdefault(tenant_id, []).append(
                EndpointFilter(endpoint_id, tenant_id, tuple(event_types or ())))
        self._by_tenant = {t: tuple(es) for t, es in by_tenant.items()}  # one atomic swap
        self._loaded_at = started
        return len(rows)

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
