"""End to end on real PostgreSQL and a real HTTP receiver: emit → relay (with the webhook
route) → worker (with the webhook registry) → signed POSTs, retried as the answers ask."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from sqlalchemy import text

from postrelay.queue import FixedBackoff
from postrelay.queue.worker import Worker, WorkerConfig
from postrelay.relay import Relay, RouteRegistry
from postrelay.relay.webhooks import EndpointDirectory, add_webhook_route, webhook_registry
from tests.webhooks.helpers import (
    add_endpoint,
    attempts_of,
    emit_event,
    endpoint_state,
    ticking_clock,
)
from tests.webhooks.receiver import Answer, Receiver


def make_worker(async_engine, libpq, **kwargs) -> Worker:
    registry = webhook_registry(async_engine, allow_private=True, **kwargs)
    return Worker(async_engine, WorkerConfig(poll_interval_secs=0.1, grace_secs=1.0),
                  registry=registry, backoff=FixedBackoff(0.05), listen_url=libpq)


async def stop(worker: Worker) -> None:
    """Stop the worker, then release what its handlers hold (the claim reads' connection),
    as the worker process does."""
    await worker.stop()
    for close in worker.registry.closers:
        await close()


async def relay_once(async_engine) -> None:
    directory = EndpointDirectory(async_engine)
    await directory.run_once()
    routes = RouteRegistry()
    add_webhook_route(routes, directory)
    result = await Relay(async_engine, routes).run_once()
    assert result.failed == 0


def jobs_by_endpoint(engine) -> dict[str, dict]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT payload->>'endpoint_id' AS endpoint, status::text AS status, attempts, "
            "available_at, last_error FROM mdm.aa_job WHERE job_kind = 'outbox_dispatch'"
        )).mappings().all()
    return {r["endpoint"]: dict(r) for r in rows}


async def wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_delivered_after_retries_with_stable_id_and_fresh_timestamps(
        engine, async_engine, libpq, wh_tenant, receiver):
    endpoint_id, secret = add_endpoint(engine, wh_tenant, receiver.url(), ["order.*"])
    receiver.secret = secret
    receiver.program(503, Answer(429, {"Retry-After": "0"}), 500, 200)
    event_id = emit_event(engine, wh_tenant, "order.placed", {"order": 42})
    await relay_once(async_engine)

    worker = make_worker(async_engine, libpq, clock=ticking_clock())
    await worker.start()
    try:
        await wait_for(lambda: jobs_by_endpoint(engine)[str(endpoint_id)]["status"] == "done")
    finally:
        await stop(worker)

    assert len(receiver.requests) == 4 and all(r.verified for r in receiver.requests)
    assert {r.headers["webhook-id"] for r in receiver.requests} == {f"msg_{event_id}"}
    stamps = [int(r.headers["webhook-timestamp"]) for r in receiver.requests]
    assert stamps == sorted(set(stamps))  # a fresh timestamp, hence signature, per attempt
    assert len({r.headers["webhook-signature"] for r in receiver.requests}) == 4
    assert len({r.body for r in receiver.requests}) == 1  # the same bytes every time
    attempts = attempts_of(engine, endpoint_id)
    assert [(a["attempt"], a["status_code"]) for a in attempts] == [
        (1, 503), (2, 429), (3, 500), (4, 200)]
    job = jobs_by_endpoint(engine)[str(endpoint_id)]
    assert job["attempts"] == 4
    # One query follows the event to its job and the job's attempts.
    with engine.connect() as conn:
        followed = conn.execute(text(
            "SELECT count(*) FROM mdm.aa_outbox_delivery d "
            "JOIN mdm.aa_webhook_attempt a ON a.job_id = d.job_id WHERE d.event_id = :e"),
            {"e": event_id}).scalar_one()
    assert followed == 4


async def test_permanent_gone_and_retry_after_through_the_worker(
        engine, async_engine, libpq, wh_tenant, receiver):
    gone_receiver, slow_receiver = Receiver(), Receiver()
    for r in (gone_receiver, slow_receiver):
        r.start()
    try:
        bad, receiver.secret = add_endpoint(engine, wh_tenant, receiver.url())
        gone, gone_receiver.secret = add_endpoint(engine, wh_tenant, gone_receiver.url())
        slow, slow_receiver.secret = add_endpoint(engine, wh_tenant, slow_receiver.url())
        receiver.program(Answer(400, body=b"schema mismatch"))
        gone_receiver.program(410)
        slow_receiver.program(Answer(429, {"Retry-After": "30"}))
        emit_event(engine, wh_tenant)
        await relay_once(async_engine)

        worker = make_worker(async_engine, libpq)
        await worker.start()
        try:
            await wait_for(lambda: all(j["attempts"] == 1 and j["status"] != "running"
                                       for j in jobs_by_endpoint(engine).values()))
        finally:
            await stop(worker)
    finally:
        for r in (gone_receiver, slow_receiver):
            r.stop()

    jobs = jobs_by_endpoint(engine)
    assert jobs[str(bad)]["status"] == "dlq" and "HTTP 400" in jobs[str(bad)]["last_error"]
    assert jobs[str(gone)]["status"] == "failed"
    assert endpoint_state(engine, gone)[0] is False
    waiting = jobs[str(slow)]
    assert waiting["status"] == "pending"
    assert (waiting["available_at"] - datetime.now(UTC)).total_seconds() > 25
    for endpoint in (bad, gone, slow):
        assert len(attempts_of(engine, endpoint)) == 1


async def test_a_worker_reuses_connections_and_closes_them_when_it_stops(
        engine, async_engine, libpq, wh_tenant):
    """50 deliveries to one endpoint through the worker take far fewer connections than
    deliveries (at most one per delivery running at once), and stopping the worker (its
    registry's closers, as the worker process runs them) closes every one left open."""
    receiver = Receiver(keep_alive=True)
    receiver.start()
    try:
        endpoint_id, receiver.secret = add_endpoint(engine, wh_tenant, receiver.url())
        for n in range(50):
            emit_event(engine, wh_tenant, payload={"order": n})
        await relay_once(async_engine)
        worker = make_worker(async_engine, libpq)
        await worker.start()
        try:
            await wait_for(lambda: len(attempts_of(engine, endpoint_id)) == 50)
            assert receiver.closed == 0  # all kept open for the next deliveries
        finally:
            await stop(worker)
        await wait_for(lambda: receiver.closed == receiver.connections)
    finally:
        receiver.stop()
    assert len(receiver.requests) == 50 and all(r.verified for r in receiver.requests)
    assert receiver.connections <= worker.config.concurrency < 50
