"""The template context of the messages that share their event's: the jobs a split or bulk
route makes from one event name the event (`context_from_event`) instead of each carrying
a copy of its payload, and the worker reads the payload when the message is sent, once for
all the messages of that event it sends (a bounded cache).

    contexts = EventContexts(engine)
    contexts.prefetch([(tenant_id, event_id), ...])    # the claim hook: one read per claim
    context = await contexts.get(tenant_id, event_id)  # None: the event is gone
    context = await contexts.of(tenant_id, email_job)  # its own, else its event's

An event is read only for its own tenant: a job names an event of its tenant, or none.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.errors import ValidationError
from postrelay.orchestrator import queries
from postrelay.orchestrator.job import EmailJob

# A split route's messages are sent within moments of each other, so a few events cover a
# worker's traffic; the bytes bound keeps large payloads (a list of ten thousand
# recipients) from piling up.
MAX_CACHED_EVENTS = 256
MAX_CACHED_BYTES = 64 << 20

Key = tuple[UUID, UUID]  # (tenant id, event id)


def event_context(payload: Mapping[str, Any], *, event_id: UUID, event_type: str,
                  tenant_id: UUID, aggregate_type: str, aggregate_id: str,
                  created_at: datetime | str) -> dict[str, Any]:
    """A template's context made from an event: its payload, plus `event` (its id, type,
    aggregate and time) unless the payload has a key of that name."""
    context = dict(payload)
    context.setdefault("event", {
        "id": str(event_id), "type": event_type, "tenant_id": str(tenant_id),
        "aggregate_type": aggregate_type, "aggregate_id": aggregate_id,
        "created_at": created_at if isinstance(created_at, str) else created_at.isoformat(),
    })
    return context


def shared_key(tenant_id: UUID, payload: Mapping[str, Any]) -> Key | None:
    """(tenant, event) of a job payload whose context is its event's; None for any other
    (one that is malformed too: its run fails it, with the reason)."""
    if payload.get("context_from_event") is not True:
        return None
    try:
        return tenant_id, UUID(str(payload.get("event_id")))
    except ValueError:
        return None


class EventContexts:
    """Events' contexts by (tenant, event), read in batches and kept while they fit."""

    def __init__(self, engine: AsyncEngine) -> None:
        """`engine`: one in autocommit mode (each read is one statement)."""
        self.engine = engine
        self._cached: OrderedDict[Key, tuple[dict[str, Any], int]] = OrderedDict()
        self._cached_bytes = 0
        self._reading: dict[Key, asyncio.Future[dict[str, Any] | None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.reads = 0  # statements run

    def prefetch(self, keys: Iterable[Key]) -> None:
        """Start one read for those of `keys` neither kept nor being read."""
        wanted = {key for key in keys if key not in self._cached and key not in self._reading}
        if wanted:
            self._start(wanted)

    async def of(self, tenant_id: UUID, message: EmailJob) -> Mapping[str, Any]:
        """The message's context: its own, or its event's. Raises ValidationError when its
        event is gone."""
        if not message.context_from_event:
            return message.context
        assert message.event_id is not None  # EmailJob.from_payload
        context = await self.get(tenant_id, message.event_id)
        if context is None:
            raise ValidationError("event_id", f"the event {message.event_id}, whose payload "
                                              "is this message's context, is gone (outbox "
                                              "retention)")
        return context

    async def get(self, tenant_id: UUID, event_id: UUID) -> dict[str, Any] | None:
        """The context of the event, or None when the tenant has no such event (outbox
        retention deleted it). A failed read raises, for the job to be tried again."""
        key = (tenant_id, event_id)
        kept = self._cached.get(key)
        if kept is not None:
            self._cached.move_to_end(key)
            return kept[0]
        if key not in self._reading:
            self._start({key})
        # Shielded: one waiting job cancelled (its timeout) leaves the read to the others.
        return await asyncio.shield(self._reading[key])

    def clear(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._cached.clear()
        self._cached_bytes = 0

    def _start(self, keys: set[Key]) -> None:
        loop = asyncio.get_running_loop()
        futures = {key: loop.create_future() for key in keys}
        self._reading.update(futures)
        task = loop.create_task(self._read(futures))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read(self, futures: dict[Key, asyncio.Future[dict[str, Any] | None]]) -> None:
        try:
            self.reads += 1
            async with self.engine.connect() as conn:
                rows = await queries.email_event_contexts(
                    conn, tenant_ids=[tenant for tenant, _ in futures],
                    event_ids=[event for _, event in futures])
            found = {}
            for (event_id, tenant_id, aggregate_type, aggregate_id, event_type, payload,
                 created_at, size) in rows:
                found[(tenant_id, event_id)] = event_context(
                    payload, event_id=event_id, tenant_id=tenant_id,
                    aggregate_type=aggregate_type, aggregate_id=aggregate_id,
                    event_type=event_type, created_at=created_at)
                self._keep((tenant_id, event_id), found[(tenant_id, event_id)], size)
            for key, future in futures.items():
                if not future.done():
                    future.set_result(found.get(key))
        except Exception as exc:
            for future in futures.values():
                if not future.done():
                    future.set_exception(exc)
                    future.exception()  # retrieved: no job may be waiting for it
        finally:
            for key, future in futures.items():
                self._reading.pop(key, None)
                future.cancel()  # the read itself was cancelled (a no-op once settled)

    def _keep(self, key: Key, context: dict[str, Any], size: int) -> None:
        if size > MAX_CACHED_BYTES or key in self._cached:
            return
        self._cached[key] = (context, size)
        self._cached_bytes += size
        while len(self._cached) > MAX_CACHED_EVENTS or self._cached_bytes > MAX_CACHED_BYTES:
            _, (_, dropped) = self._cached.popitem(last=False)
            self._cached_bytes -= dropped
