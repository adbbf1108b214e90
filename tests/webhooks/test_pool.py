"""Deliveries reuse open connections (pool.py), counted by the receivers on loopback, and
keep what held when every delivery had a connection of its own: the guard runs for each,
a reused connection goes to the address just checked, a private CA's connections are its
own, redirects are not followed, timeouts hold, a connection the receiver closed is
replaced without failing the delivery, and nothing is sent twice within an attempt."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from postrelay.queue import PermanentError
from postrelay.relay.webhooks import WebhookDeliveryError, netguard, webhook_add, webhook_handler
from postrelay.relay.webhooks.netguard import AddressRefused
from postrelay.relay.webhooks.pool import DeliveryClients
from tests.httpserver import serving_https
from tests.webhooks.helpers import as_worker_runs, attempts_of, dispatch_job, emit_event
from tests.webhooks.receiver import Answer, Receiver


@pytest.fixture
def kept() -> Iterator[Receiver]:
    """A receiver that keeps connections open (HTTP/1.1), as most do."""
    server = Receiver(keep_alive=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def clients():
    pool = DeliveryClients()
    yield pool
    await pool.close()


def add(engine, tenant: uuid.UUID, url: str, receiver: Receiver | None,
        ca_pem: str | None = None) -> uuid.UUID:
    """An endpoint; `receiver` (if given) verifies with its secret from now on."""
    with engine.begin() as conn:
        endpoint, secret = webhook_add(conn, tenant, url, allow_private=True, ca_pem=ca_pem)
    if receiver is not None:
        receiver.secret = secret
    return endpoint.id


def deliverer(engine, async_engine, tenant, clients, **kwargs) -> Callable:
    kwargs.setdefault("allow_private", True)
    handler = as_worker_runs(webhook_handler(async_engine, clients=clients, **kwargs),
                             async_engine)

    async def deliver(endpoint_id: uuid.UUID) -> None:
        await handler(dispatch_job(tenant, emit_event(engine, tenant), endpoint_id))
    return deliver


async def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_deliveries_to_one_endpoint_reuse_its_connections(
        engine, async_engine, wh_tenant, kept, clients):
    endpoint_id = add(engine, wh_tenant, kept.url(), kept)
    deliver = deliverer(engine, async_engine, wh_tenant, clients)
    for _ in range(20):
        await deliver(endpoint_id)
    assert len(kept.requests) == 20 and all(r.verified for r in kept.requests)
    assert kept.connections == 1
    for _ in range(3):  # waves of 5 at once: at most 5 connections, each kept for the next
        await asyncio.gather(*(deliver(endpoint_id) for _ in range(5)))
    assert len(kept.requests) == 35 and kept.connections <= 5
    assert {a["status_code"] for a in attempts_of(engine, endpoint_id)} == {200}


async def test_a_handler_without_clients_keeps_no_connection(engine, async_engine, wh_tenant,
                                                             kept):
    endpoint_id = add(engine, wh_tenant, kept.url(), kept)
    deliver = deliverer(engine, async_engine, wh_tenant, None)
    for _ in range(3):
        await deliver(endpoint_id)
    await wait_for(lambda: kept.closed == 3)
    assert kept.connections == 3


async def test_the_guard_runs_for_every_delivery_despite_an_open_connection(
        engine, async_engine, wh_tenant, kept, clients, dns, monkeypatch):
    """hooks.test first resolves to an address the guard passes (127.0.0.1 stands in for a
    public one here), then to a private one: that delivery is refused although a connection
    to the old address is open, and nothing is sent. Back to the old address, the open
    connection is used again."""
    monkeypatch.setattr(netguard, "is_public", lambda ip: str(ip) == "127.0.0.1")
    endpoint_id = add(engine, wh_tenant, f"http://hooks.test:{kept.port}/hook", kept)
    deliver = deliverer(engine, async_engine, wh_tenant, clients, allow_private=False)
    dns["hooks.test"] = ["127.0.0.1"]
    await deliver(endpoint_id)
    dns["hooks.test"] = ["10.0.0.7"]
    with pytest.raises(AddressRefused, match="10.0.0.7"):
        await deliver(endpoint_id)
    assert len(kept.requests) == 1
    dns["hooks.test"] = ["127.0.0.1"]
    await deliver(endpoint_id)
    assert len(kept.requests) == 2 and kept.connections == 1
    assert [a["status_code"] for a in attempts_of(engine, endpoint_id)] == [200, None, 200]


async def test_a_name_that_resolves_elsewhere_is_not_sent_on_its_old_connection(
        engine, async_engine, wh_tenant, kept, clients, dns):
    elsewhere = Receiver(keep_alive=True, bind="127.0.0.2", port=kept.port)
    elsewhere.start()
    try:
        endpoint_id = add(engine, wh_tenant, f"http://hooks.test:{kept.port}/hook", kept)
        elsewhere.secret = kept.secret
        deliver = deliverer(engine, async_engine, wh_tenant, clients)
        for address in ("127.0.0.1", "127.0.0.2", "127.0.0.1", "127.0.0.2"):
            dns["hooks.test"] = [address]
            await deliver(endpoint_id)
        assert (len(kept.requests), len(elsewhere.requests)) == (2, 2)
        assert (kept.connections, elsewhere.connections) == (1, 1)
        assert kept.requests[0].headers["host"] == f"hooks.test:{kept.port}"
    finally:
        elsewhere.stop()


async def test_a_private_ca_endpoint_and_a_default_trust_one_never_share_a_connection(
        engine, async_engine, wh_tenant, clients, ca):
    """Both endpoints name the same receiver: the one trusting its CA delivers and keeps
    the connection open, the one on the default bundle is refused by the certificate check
    all the same, and a second endpoint of the same CA shares the first one's connection."""
    receiver = Receiver(keep_alive=True)
    pem = ca.cert_pem.bytes().decode("ascii")
    with serving_https(receiver.handler_class(), ca, "localhost") as base:
        url = base.replace("127.0.0.1", "localhost")
        default = add(engine, wh_tenant, f"{url}/c", None)
        with_ca = add(engine, wh_tenant, f"{url}/a", receiver, pem)
        deliver = deliverer(engine, async_engine, wh_tenant, clients)
        await deliver(with_ca)
        for _ in range(2):
            with pytest.raises(WebhookDeliveryError, match="CERTIFICATE_VERIFY_FAILED"):
                await deliver(default)
        await deliver(with_ca)
        same_ca = add(engine, wh_tenant, f"{url}/b", receiver, pem)
        await deliver(same_ca)
    assert [(r.path, r.verified) for r in receiver.requests] == [
        ("/a", True), ("/a", True), ("/b", True)]
    assert receiver.connections == 1
    assert all("CERTIFICATE_VERIFY_FAILED" in a["error"] for a in attempts_of(engine, default))


async def test_redirects_are_not_followed(engine, async_engine, wh_tenant, kept, clients):
    endpoint_id = add(engine, wh_tenant, kept.url(), kept)
    deliver = deliverer(engine, async_engine, wh_tenant, clients)
    await deliver(endpoint_id)
    kept.program(Answer(302, {"Location": kept.url("/elsewhere")}))
    with pytest.raises(PermanentError, match="HTTP 302"):
        await deliver(endpoint_id)
    assert [r.path for r in kept.requests] == ["/hook", "/hook"]


async def test_a_timeout_on_a_reused_connection_fails_it_and_it_is_not_reused(
        engine, async_engine, wh_tenant, kept, clients):
    endpoint_id = add(engine, wh_tenant, kept.url(), kept)
    deliver = deliverer(engine, async_engine, wh_tenant, clients, timeout_secs=0.5)
    await deliver(endpoint_id)
    kept.program(Answer(200, delay_secs=1.5))
    started = time.monotonic()
    with pytest.raises(WebhookDeliveryError, match="timed out after 0.5 s"):
        await deliver(endpoint_id)
    assert time.monotonic() - started < 1.4
    await deliver(endpoint_id)  # a new connection: the old one may still get its answer
    assert len(kept.requests) == 3 and kept.connections == 2


async def test_a_connection_the_receiver_closed_is_replaced_without_a_failure(
        engine, async_engine, wh_tenant, clients):
    """The receiver closes connections idle for 0.2 s; the next delivery finds its pooled
    connection closed before sending on it, opens another, and is delivered once."""
    receiver = Receiver(keep_alive=True, idle_timeout_secs=0.2)
    receiver.start()
    try:
        endpoint_id = add(engine, wh_tenant, receiver.url(), receiver)
        deliver = deliverer(engine, async_engine, wh_tenant, clients)
        await deliver(endpoint_id)
        await wait_for(lambda: receiver.closed == 1)
        await deliver(endpoint_id)
    finally:
        receiver.stop()
    assert len(receiver.requests) == 2 and receiver.connections == 2
    attempts = attempts_of(engine, endpoint_id)
    assert [(a["status_code"], a["error"]) for a in attempts] == [(200, None), (200, None)]


async def test_a_request_that_may_have_been_received_is_not_sent_again(
        engine, async_engine, wh_tenant, kept, clients):
    """The receiver takes the request on the reused connection and closes it unanswered:
    the attempt fails (the job retries it later, as a new attempt) rather than sending the
    request again on a new connection."""
    endpoint_id = add(engine, wh_tenant, kept.url(), kept)
    deliver = deliverer(engine, async_engine, wh_tenant, clients)
    await deliver(endpoint_id)
    kept.program(Answer(drop=True))
    with pytest.raises(WebhookDeliveryError, match="disconnected"):
        await deliver(endpoint_id)
    assert len(kept.requests) == 2 and kept.connections == 1
    await deliver(endpoint_id)
    assert len(kept.requests) == 3 and kept.connections == 2


async def test_close_closes_the_idle_connections(engine, async_engine, wh_tenant, kept):
    pool = DeliveryClients()
    endpoint_id = add(engine, wh_tenant, kept.url(), kept)
    await deliverer(engine, async_engine, wh_tenant, pool)(endpoint_id)
    assert kept.closed == 0 and len(pool) == 1
    await pool.close()
    await wait_for(lambda: kept.closed == 1)
    assert len(pool) == 0


async def test_targets_unused_past_the_keepalive_are_closed(engine, async_engine, wh_tenant,
                                                            kept, dns):
    """httpcore closes an expired connection only when its client sends again; a target
    that gets nothing more has its client closed by the next delivery to any target."""
    now = [0.0]
    pool = DeliveryClients(keepalive_secs=60.0, clock=lambda: now[0])
    dns["hooks.test"] = ["127.0.0.1"]
    deliver = deliverer(engine, async_engine, wh_tenant, pool)
    await deliver(add(engine, wh_tenant, f"http://hooks.test:{kept.port}/hook", kept))
    endpoint_id = add(engine, wh_tenant, kept.url(), kept)
    await deliver(endpoint_id)
    now[0] = 61.0
    await deliver(endpoint_id)  # its own target was last used 61 s ago too, but is in use
    await wait_for(lambda: kept.closed == 1)
    assert len(pool) == 1 and kept.connections == 2 and len(kept.requests) == 3
    await pool.close()


async def test_past_the_target_bound_the_least_recently_used_is_closed(
        engine, async_engine, wh_tenant, kept, dns):
    pool = DeliveryClients(targets=2)
    deliver = deliverer(engine, async_engine, wh_tenant, pool)
    for name in ("a.test", "b.test", "c.test"):
        dns[name] = ["127.0.0.1"]
        await deliver(add(engine, wh_tenant, f"http://{name}:{kept.port}/hook", kept))
    await wait_for(lambda: kept.closed == 1)
    assert len(pool) == 2 and kept.connections == 3
    await pool.close()
    await wait_for(lambda: kept.closed == 3)

