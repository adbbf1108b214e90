"""Outbox events that SQL written by hand (another service's, in its own transaction) can
store and `emit` never writes: the relay relays them, and the events beside them, and
their webhooks go out."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from sqlalchemy import text

from postrelay.relay import Event, JobRequest, Relay, RouteRegistry
from postrelay.relay.webhooks import webhook_handler
from tests.webhooks.helpers import add_endpoint, as_worker_runs, dispatch_job, emit_event
from tests.webhooks.test_end_to_end import relay_once

# The earliest and latest times Python has, as the CLI, the API and the dashboard show
# the infinities; and PostgreSQL's first year past Python's.
SHOWN = {"infinity": "9999-12-31T23:59:59.999999", "-infinity": "0001-01-01T00:00:00",
         "12000-01-01": "9999-12-31T23:59:59.999999"}


def created_at(engine, event_id, at: str) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_outbox_event SET created_at = CAST(:at AS timestamptz)"
                          " WHERE id = :id"), {"at": at, "id": event_id})


async def test_events_created_at_infinity_are_relayed_with_the_rest(engine, async_engine,
                                                                    wh_tenant):
    """The relay read created_at as Python's datetime, which has no infinity: one event at
    'infinity' or '-infinity' failed every batch it was claimed in ("timestamp too large"),
    and the relay relayed nothing, for ever."""
    seen: dict[str, str] = {}
    routes = RouteRegistry()

    @routes.route("order.placed", name="reindex")
    def reindex(event: Event) -> JobRequest:
        seen[str(event.id)] = event.created_at.isoformat()
        return JobRequest("reindex", {"order": event.payload["order"]})

    odd = {at: emit_event(engine, wh_tenant) for at in SHOWN}
    plain = emit_event(engine, wh_tenant)
    for at, event_id in odd.items():
        created_at(engine, event_id, at)
    result = await Relay(async_engine, routes).run_once()
    assert (result.handled, result.jobs, result.failed) == (4, 4, 0)
    assert seen[str(plain)][:4] == str(datetime.now(UTC).year)
    for at, event_id in odd.items():
        assert seen[str(event_id)].startswith(SHOWN[at]), at


async def test_a_webhook_of_an_event_created_at_infinity_is_delivered(
        engine, async_engine, wh_tenant, receiver):
    """The delivery read the event's created_at for the body's timestamp: at 'infinity' the
    load failed, every attempt, until the delivery was dead-lettered unsent."""
    endpoint_id, secret = add_endpoint(engine, wh_tenant, receiver.url())
    receiver.secret = secret
    deliver = as_worker_runs(webhook_handler(async_engine, allow_private=True), async_engine)
    for at, shown in SHOWN.items():
        event_id = emit_event(engine, wh_tenant)
        created_at(engine, event_id, at)
        await relay_once(async_engine)
        await deliver(dispatch_job(wh_tenant, event_id, endpoint_id))
        body = json.loads(receiver.requests[-1].body)
        assert receiver.requests[-1].verified and body["timestamp"].startswith(shown), at
        assert body["data"] == {"order": 42, "total": "9.90"}
