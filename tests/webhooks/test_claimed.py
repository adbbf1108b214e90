"""The read started when deliveries are claimed (relay/webhooks/claimed.py), on real
PostgreSQL and a real HTTP receiver: one round trip per claim, taken by the runs that start
within EARLY_SECS; a later run, a malformed payload or a failed read fall back to the run's
own read."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.queue import PermanentError, Registry, StopJob
from postrelay.queue.worker import Worker, WorkerConfig
from postrelay.relay.webhooks import webhook_handler, webhook_registry
from postrelay.relay.webhooks.claimed import EARLY_SECS, ClaimedDeliveries
from postrelay.relay.webhooks.handler import _parse_payload
from postrelay.relay.webhooks.route import DISPATCH_KIND
from tests.webhooks.helpers import (
    add_endpoint,
    as_worker_runs,
    attempts_of,
    dispatch_job,
    emit_event,
)
from tests.webhooks.receiver import Receiver
from tests.webhooks.test_end_to_end import jobs_by_endpoint, relay_once, wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def own_reads(async_engine: AsyncEngine) -> Iterator[list[str]]:
    """The statements of runs that read on their own (`webhook_delivery_load`, through the
    pool); the claim's read goes through a held connection's driver and is counted by
    `round_trips`."""
    seen: list[str] = []

    def count(conn, cursor, statement, params, context, executemany) -> None:  # noqa: ANN001
        if "one(x)" in statement and "aa_webhook_endpoint" in statement:
            seen.append(statement)

    event.listen(async_engine.sync_engine, "before_cursor_execute", count)
    yield seen
    event.remove(async_engine.sync_engine, "before_cursor_execute", count)


def hand_built(async_engine: AsyncEngine, clock: Clock) -> tuple[Registry, ClaimedDeliveries]:
    """The registry webhook_registry builds, with a clock the test moves."""
    claimed = ClaimedDeliveries(async_engine, _parse_payload, clock=clock)
    registry = Registry()
    registry.register(DISPATCH_KIND, as_worker_runs(
        webhook_handler(async_engine, allow_private=True, claimed=claimed), async_engine),
        on_claim=claimed.claimed)
    registry.closers.append(claimed.close)
    return registry, claimed


async def test_a_claim_reads_its_deliveries_in_one_round_trip(
        engine: Engine, async_engine: AsyncEngine, libpq: str, wh_tenant: uuid.UUID,
        receiver: Receiver, own_reads: list[str]) -> None:
    endpoint_id, receiver.secret = add_endpoint(engine, wh_tenant, receiver.url())
    for n in range(5):
        emit_event(engine, wh_tenant, payload={"order": n})
    await relay_once(async_engine)

    registry = webhook_registry(async_engine, allow_private=True)
    worker = Worker(async_engine, WorkerConfig(poll_interval_secs=0.1, grace_secs=1.0),
                    registry=registry, listen_url=libpq)
    await worker.start()
    try:
        await wait_for(lambda: jobs_by_endpoint(engine)[str(endpoint_id)]["status"] == "done"
                       and len(attempts_of(engine, endpoint_id)) == 5)
    finally:
        await worker.stop()
        for close in registry.closers:
            await close()

    handler = registry.get(DISPATCH_KIND)
    assert handler is not None and handler.on_claim is not None
    claimed = handler.on_claim.__self__  # type: ignore[attr-defined]
    assert claimed.round_trips == 1 and own_reads == []
    assert len(receiver.requests) == 5 and all(r.verified for r in receiver.requests)
    assert {a["status_code"] for a in attempts_of(engine, endpoint_id)} == {200}


async def test_a_run_after_the_window_reads_again_and_sees_a_disabled_endpoint(
        engine: Engine, async_engine: AsyncEngine, wh_tenant: uuid.UUID, receiver: Receiver,
        own_reads: list[str]) -> None:
    endpoint_id, receiver.secret = add_endpoint(engine, wh_tenant, receiver.url())
    early, late = (dispatch_job(wh_tenant, emit_event(engine, wh_tenant), endpoint_id)
                   for _ in range(2))
    clock = Clock()
    registry, claimed = hand_built(async_engine, clock)
    run = registry.get(DISPATCH_KIND)
    assert run is not None
    try:
        registry.announce([early, late])  # as the worker does with a claim
        await run.fn(early)  # at once: the claim's row
        assert claimed.round_trips == 1 and own_reads == []
        with engine.begin() as conn:
            conn.execute(text("UPDATE mdm.aa_webhook_endpoint SET enabled = false, "
                              "disabled_by = 'operator' WHERE id = :e"), {"e": endpoint_id})
        clock.now += EARLY_SECS
        with pytest.raises(StopJob, match="disabled"):
            await run.fn(late)
    finally:
        for close in registry.closers:
            await close()
    assert len(own_reads) == 1 and claimed.round_trips == 1
    assert len(receiver.requests) == 1


async def test_a_malformed_payload_fails_its_run_and_leaves_the_claims_read_to_the_others(
        engine: Engine, async_engine: AsyncEngine, wh_tenant: uuid.UUID, receiver: Receiver,
        own_reads: list[str]) -> None:
    endpoint_id, receiver.secret = add_endpoint(engine, wh_tenant, receiver.url())
    first, second = (dispatch_job(wh_tenant, emit_event(engine, wh_tenant), endpoint_id)
                     for _ in range(2))
    broken = dispatch_job(wh_tenant, emit_event(engine, wh_tenant), endpoint_id)
    broken.payload["event_id"] = "not-a-uuid"
    registry, claimed = hand_built(async_engine, Clock())
    run = registry.get(DISPATCH_KIND)
    assert run is not None
    try:
        registry.announce([first, broken, second])
        await run.fn(first)
        with pytest.raises(PermanentError, match="event_id and endpoint_id UUIDs"):
            await run.fn(broken)
        await run.fn(second)
    finally:
        for close in registry.closers:
            await close()
    assert claimed.round_trips == 1 and own_reads == []
    assert len(receiver.requests) == 2


async def test_a_failed_claim_read_leaves_each_run_to_read_on_its_own(
        engine: Engine, async_engine: AsyncEngine, wh_tenant: uuid.UUID, receiver: Receiver,
        own_reads: list[str]) -> None:
    endpoint_id, receiver.secret = add_endpoint(engine, wh_tenant, receiver.url())
    jobs = [dispatch_job(wh_tenant, emit_event(engine, wh_tenant), endpoint_id)
            for _ in range(4)]
    registry, claimed = hand_built(async_engine, Clock())
    run = registry.get(DISPATCH_KIND)
    assert run is not None
    try:
        registry.announce(jobs[:2])
        for job in jobs[:2]:
            await run.fn(job)
        assert own_reads == []
        # The claim read's connection is lost (a server restart, a proxy's idle timeout):
        # the next claim's read fails on it.
        with engine.connect() as conn:
            killed = conn.execute(text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND query LIKE '%jsonb_to_recordset%AS p(job_id uuid%'")).scalar_one()
        assert killed == 1
        registry.announce(jobs[2:])
        for job in jobs[2:]:
            await run.fn(job)
        assert len(own_reads) == 2
        later = dispatch_job(wh_tenant, emit_event(engine, wh_tenant), endpoint_id)
        registry.announce([later])  # the next claim's read connects again
        await run.fn(later)
    finally:
        for close in registry.closers:
            await close()
    assert claimed.round_trips == 3 and len(own_reads) == 2
    assert len(receiver.requests) == 5 and all(r.verified for r in receiver.requests)
    assert [a["status_code"] for a in attempts_of(engine, endpoint_id)] == [200] * 5
