"""The transactional outbox: the relay's backlog, one event and its jobs, and replay.

A tenant key sees and replays only its tenant's events; another tenant's event is not
found, exactly like a missing one. Replays are logged with the caller's identity.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Path

from postrelay.api.auth import Caller
from postrelay.api.bodies import JsonBodyRoute
from postrelay.api.common import Db, errors
from postrelay.api.models import (
    Envelope,
    OutboxEventOut,
    OutboxStatusOut,
    ReplayBody,
    Replayed,
)
from postrelay.core.errors import NotFoundError
from postrelay.core.telemetry import event
from postrelay.relay import outbox_event_get, outbox_replay, outbox_status

router = APIRouter(prefix="/v1/functions/outbox", tags=["outbox"], route_class=JsonBodyRoute)

EventId = Annotated[UUID, Path(alias="id", description="The outbox event's id.")]


@router.get("/status", response_model=Envelope[OutboxStatusOut], responses=errors(401))
def get_outbox_status(caller: Caller, engine: Db) -> Envelope[OutboxStatusOut]:
    """Backlog, relay lag (age of the oldest unrelayed event), handled, retrying and dead
    counts, and the most recent dead events — as `postrelay outbox status` shows them."""
    with engine.begin() as conn:
        status = outbox_status(conn, tenant_id=caller.tenant_id)
    return Envelope(data=OutboxStatusOut.of(status))


@router.get("/events/{id}", response_model=Envelope[OutboxEventOut],
            responses=errors(400, 401, 404))
def get_outbox_event(event_id: EventId, caller: Caller, engine: Db) -> Envelope[OutboxEventOut]:
    """One event, its relay state and every job it produced (one per route)."""
    with engine.begin() as conn:
        found = outbox_event_get(conn, event_id, tenant_id=caller.tenant_id)
    if found is None:
        raise NotFoundError(f"no outbox event {event_id}")
    return Envelope(data=OutboxEventOut.of(found))


@router.post("/replay", response_model=Envelope[Replayed], responses=errors(400, 401, 404))
def replay_outbox(body: ReplayBody, caller: Caller, engine: Db) -> Envelope[Replayed]:
    """Hand one event (`eventId`) or a time range (`since`/`until`) back to the relay;
    `dead: true` narrows a range to the events the relay gave up on (alone: all of them).
    Jobs that still exist are not created again, but for webhook deliveries that stopped
    unsent while their endpoint was disabled. An unknown `eventId` (or another
    tenant's) is 404; a range that matches nothing replays 0. A tenant key replays its
    own tenant's events only."""
    since, until = _utc(body.since), _utc(body.until)
    with engine.begin() as conn:
        count = outbox_replay(conn, event_id=body.event_id, since=since, until=until,
                              tenant_id=caller.tenant_id, dead=body.dead)
    # The record of the replay (there is no audit row): what was asked, by whom, how many.
    event("postrelay.api.outbox_replay", logging.INFO, replayed=count, actor=caller.actor,
          tenant_id=str(caller.tenant_id) if caller.tenant_id else None,
          event_id=str(body.event_id) if body.event_id else None,
          since=since.isoformat() if since else None,
          until=until.isoformat() if until else None, dead=body.dead)
    return Envelope(data=Replayed(replayed=count))


def _utc(value: datetime | None) -> datetime | None:
    """A time without a zone is UTC, as `postrelay outbox replay` reads it."""
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value
