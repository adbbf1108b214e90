"""Recovering what an endpoint missed: after `webhooks enable`, `outbox replay` delivers
the events whose deliveries stopped unsent while the endpoint was disabled."""

from __future__ import annotations

from sqlalchemy import text

from postrelay.relay import outbox_replay
from postrelay.relay.webhooks import webhook_disable, webhook_enable
from tests.webhooks.helpers import add_endpoint, emit_event
from tests.webhooks.test_end_to_end import make_worker, relay_once, stop, wait_for


def dispatch_jobs(engine) -> list[tuple[str, str]]:
    """(status, idempotency key) of every outbox_dispatch job, oldest first."""
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(  # type: ignore[misc]
            "SELECT status::text, idempotency_key FROM mdm.aa_job "
            "WHERE job_kind = 'outbox_dispatch' ORDER BY created_at, id"))]


async def test_replay_redelivers_what_stopped_while_the_endpoint_was_disabled(
        engine, async_engine, libpq, wh_tenant, receiver):
    """The deliveries queued for an endpoint when it was disabled stop as `failed`. After
    `webhooks enable`, `outbox replay` said "replayed" for their events, but the relay found
    their links and made no job: exactly the events the endpoint had been failing were
    never delivered, and nothing said so."""
    endpoint_id, receiver.secret = add_endpoint(engine, wh_tenant, receiver.url())
    event_id = emit_event(engine, wh_tenant)
    await relay_once(async_engine)
    with engine.begin() as conn:
        webhook_disable(conn, endpoint_id, reason="receiver down for maintenance")
    worker = make_worker(async_engine, libpq)
    await worker.start()
    try:
        await wait_for(lambda: [s for s, _ in dispatch_jobs(engine)] == ["failed"])
        assert receiver.requests == []
        with engine.begin() as conn:
            webhook_enable(conn, endpoint_id)
            assert outbox_replay(conn, event_id=event_id) == 1
        await relay_once(async_engine)
        await wait_for(lambda: [s for s, _ in dispatch_jobs(engine)] == ["failed", "done"])
    finally:
        await stop(worker)
    (request,) = receiver.requests
    assert request.verified and request.headers["webhook-id"] == f"msg_{event_id}"
    (_, stopped), (_, delivered) = dispatch_jobs(engine)
    assert stopped == delivered  # the same delivery, made again
    # A replay after the delivery makes no third job.
    with engine.begin() as conn:
        outbox_replay(conn, event_id=event_id)
    await relay_once(async_engine)
    assert len(dispatch_jobs(engine)) == 2
