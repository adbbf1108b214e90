"""The endpoint directory and the webhook route: one outbox_dispatch job per (event,
matching endpoint), deterministic keys, and changes seen at once through NOTIFY."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import text

from postrelay.queue import ensure_tenant
from postrelay.relay import Relay, RouteRegistry
from postrelay.relay.webhooks import (
    WEBHOOK_ROUTE,
    DirectoryNotReady,
    EndpointDirectory,
    add_webhook_route,
    webhook_disable,
    webhook_enable,
    webhook_remove,
    webhook_route,
)
from tests.webhooks.helpers import add_endpoint, emit_event


def webhook_jobs(engine, event_id):
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT d.route, j.payload->>'endpoint_id', j.idempotency_key, j.job_kind::text "
            "FROM mdm.aa_outbox_delivery d JOIN mdm.aa_job j ON j.id = d.job_id "
            "WHERE d.event_id = :e ORDER BY 2"), {"e": event_id}).all()


async def test_one_job_per_matching_endpoint_with_deterministic_keys(engine, async_engine,
                                                                    wh_tenant):
    url = "https://hooks.example.com/in"
    every, _ = add_endpoint(engine, wh_tenant, url)
    orders, _ = add_endpoint(engine, wh_tenant, url, ["order.*"])
    add_endpoint(engine, wh_tenant, url, ["user.created"])  # filtered out
    disabled, _ = add_endpoint(engine, wh_tenant, url)
    with engine.begin() as conn:
        webhook_disable(conn, disabled)
        other_tenant = ensure_tenant(conn, "globex")
    add_endpoint(engine, other_tenant, url)  # another tenant's
    event_id = emit_event(engine, wh_tenant, "order.placed")

    directory = EndpointDirectory(async_engine)
    assert await directory.run_once() == 4  # enabled endpoints of every tenant
    routes = RouteRegistry()
    add_webhook_route(routes, directory)
    relay = Relay(async_engine, routes)
    result = await relay.run_once()
    assert (result.handled, result.jobs, result.failed) == (1, 2, 0)
    jobs = webhook_jobs(engine, event_id)
    assert sorted(endpoint for _, endpoint, _, _ in jobs) == sorted([str(every), str(orders)])
    for route, endpoint, key, kind in jobs:
        assert kind == "outbox_dispatch" and route == f"postrelay.webhooks:{endpoint}"
        assert key == f"outbox:{event_id}:postrelay.webhooks:{endpoint}"
    # A replayed event makes no second job for any endpoint.
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_outbox_event SET handled_at = NULL"))
    await relay.run_once()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job")).scalar_one() == 2


async def test_an_unloaded_or_stale_directory_refuses_to_route(engine, async_engine, wh_tenant):
    directory = EndpointDirectory(async_engine, refresh_secs=0.05, max_stale_secs=0.05)
    with pytest.raises(DirectoryNotReady, match="not loaded"):
        directory.matching(wh_tenant, "order.placed")
    await directory.run_once()
    assert directory.matching(wh_tenant, "order.placed") == []
    await asyncio.sleep(0.1)
    with pytest.raises(DirectoryNotReady, match="old"):
        directory.matching(wh_tenant, "order.placed")
    # Through a relay whose route does not catch the directory up: the event is kept for a
    # retry, not marked handled without webhooks.
    routes = RouteRegistry()
    routes.add("*", webhook_route(directory), name=WEBHOOK_ROUTE)
    event_id = emit_event(engine, wh_tenant)
    result = await Relay(async_engine, routes).run_once()
    assert (result.handled, result.failed) == (0, 1)
    with engine.connect() as conn:
        row = conn.execute(text("SELECT handled_at, last_error FROM mdm.aa_outbox_event "
                                "WHERE id = :e"), {"e": event_id}).one()
    assert row[0] is None and "DirectoryNotReady" in row[1]
    # add_webhook_route's does, in the batch: the snapshot is checked (and found current),
    # so the event is relayed.
    routes = RouteRegistry()
    add_webhook_route(routes, directory)
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_outbox_event SET available_at = now()"))
    result = await Relay(async_engine, routes).run_once()
    assert (result.handled, result.failed) == (1, 0)


async def test_changes_reach_the_directory_through_notify(engine, async_engine, libpq, wh_tenant):
    # A refresh interval far beyond the test: only the NOTIFY can bring the change in time.
    directory = EndpointDirectory(async_engine, listen_url=libpq, refresh_secs=60.0,
                                  max_stale_secs=3600.0)
    await directory.start()
    try:
        await asyncio.wait_for(directory._listener.connected.wait(), 5)
        started = time.monotonic()
        endpoint_id, _ = add_endpoint(engine, wh_tenant, "https://hooks.example.com/in")
        while not directory.matching(wh_tenant, "order.placed"):
            assert time.monotonic() - started < 5, "the NOTIFY never arrived"
            await asyncio.sleep(0.01)
        with engine.begin() as conn:
            webhook_disable(conn, endpoint_id)
        while directory.matching(wh_tenant, "order.placed"):
            assert time.monotonic() - started < 5, "the NOTIFY never arrived"
            await asyncio.sleep(0.01)
    finally:
        await directory.stop()


async def test_an_event_after_an_endpoint_change_is_routed_by_that_change(
        engine, async_engine, wh_tenant):
    # No NOTIFY and a refresh far beyond the test, as behind a transaction pooler between
    # two reloads: the relay's batch must still see what committed before its events did.
    directory = EndpointDirectory(async_engine, refresh_secs=3600.0, max_stale_secs=3600.0)
    await directory.run_once()
    routes = RouteRegistry()
    add_webhook_route(routes, directory)
    relay = Relay(async_engine, routes)
    url = "https://hooks.example.com/in"
    added, _ = add_endpoint(engine, wh_tenant, url)
    first = emit_event(engine, wh_tenant)
    assert (await relay.run_once()).jobs == 1
    assert [e for _, e, _, _ in webhook_jobs(engine, first)] == [str(added)]
    # Enabled again after a disable, and a second one added: both get the next event...
    with engine.begin() as conn:
        webhook_disable(conn, added)
    disabled = emit_event(engine, wh_tenant)
    assert (await relay.run_once()).jobs == 0
    assert webhook_jobs(engine, disabled) == []
    with engine.begin() as conn:
        webhook_enable(conn, added)
    other, _ = add_endpoint(engine, wh_tenant, url)
    second = emit_event(engine, wh_tenant)
    assert (await relay.run_once()).jobs == 2
    assert sorted(e for _, e, _, _ in webhook_jobs(engine, second)) == sorted(
        [str(added), str(other)])
    # ...and one removed gets none.
    with engine.begin() as conn:
        webhook_remove(conn, other)
    third = emit_event(engine, wh_tenant)
    assert (await relay.run_once()).jobs == 1
    assert [e for _, e, _, _ in webhook_jobs(engine, third)] == [str(added)]
    # A batch after no change reloads nothing: one statement checks the snapshot.
    loads = directory.loads
    emit_event(engine, wh_tenant)
    assert (await relay.run_once()).jobs == 1
    assert directory.loads == loads
