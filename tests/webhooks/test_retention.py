"""Outbox retention and webhook deliveries: a delivery reads its event when it runs, so an
event is kept while a delivery of it is still to run."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text

from postrelay.core.clock import utcnow
from postrelay.relay import Relay, RouteRegistry, delete_handled_batch
from postrelay.relay.webhooks import EndpointDirectory, add_webhook_route
from tests.webhooks.helpers import add_endpoint, emit_event


async def test_an_event_with_a_delivery_still_to_run_is_kept(engine, async_engine, wh_tenant):
    """Retention deleted a handled event whose delivery was still queued (an endpoint
    throttled by Retry-After, a paused kind, a short POSTRELAY_OUTBOX_RETENTION_DAYS): the
    delivery then went to the DLQ as "no longer exists", and no retry could send it."""
    add_endpoint(engine, wh_tenant, "https://hooks.example.com/in")
    events = [emit_event(engine, wh_tenant) for _ in range(3)]
    directory = EndpointDirectory(async_engine)
    await directory.run_once()
    routes = RouteRegistry()
    add_webhook_route(routes, directory)
    assert (await Relay(async_engine, routes).run_once()).jobs == 3
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_outbox_event "
                          "SET handled_at = now() - interval '8 days'"))
        # The first event's delivery is done, the second's dead-lettered (a retry of it
        # fails as gone, as after any window), the third's still waiting.
        for event_id, status in zip(events, ("done", "dlq", "pending"), strict=True):
            conn.execute(text(
                "UPDATE mdm.aa_job j SET status = CAST(:s AS mdm.job_status) "
                "FROM mdm.aa_outbox_delivery d WHERE d.job_id = j.id AND d.event_id = :e"),
                {"s": status, "e": event_id})
    assert await delete_handled_batch(async_engine, utcnow() - timedelta(days=7), 1000) == 2
    with engine.connect() as conn:
        left = conn.execute(text("SELECT id FROM mdm.aa_outbox_event")).scalars().all()
        links = conn.execute(text("SELECT event_id FROM mdm.aa_outbox_delivery")).scalars()
        assert left == [events[2]] and list(links) == [events[2]]
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_job SET status = 'done'"))
    assert await delete_handled_batch(async_engine, utcnow() - timedelta(days=7), 1000) == 1
