"""POSTRELAY_WEBHOOK_ALLOW_PRIVATE is the operator's, for their own receivers inside the
network: an endpoint a tenant key added (`private_allowed` false) never reaches a loopback
or private address, though its public host name resolves to one at delivery and the
worker's setting is on; an operator's endpoint (the CLI, the service-role key, code) does."""

from __future__ import annotations

import pytest

from postrelay.relay.webhooks import webhook_add, webhook_handler
from postrelay.relay.webhooks.netguard import AddressRefused
from tests.webhooks.helpers import as_worker_runs, attempts_of, dispatch_job, emit_event
from tests.webhooks.receiver import Receiver


@pytest.fixture
def receiver():
    server = Receiver()
    server.start()
    yield server
    server.stop()


async def test_a_tenant_s_endpoint_never_reaches_a_private_address(
        engine, async_engine, wh_tenant, receiver, dns):
    dns["hooks.tenant.example"] = ["127.0.0.1"]  # a public name the tenant points inside
    url = f"http://hooks.tenant.example:{receiver.port}/hook"
    with engine.begin() as conn:
        tenants, _ = webhook_add(conn, wh_tenant, url, private_allowed=False)
        operators, receiver.secret = webhook_add(conn, wh_tenant, url)
    deliver = as_worker_runs(webhook_handler(async_engine, allow_private=True), async_engine)
    with pytest.raises(AddressRefused, match="127.0.0.1"):
        await deliver(dispatch_job(wh_tenant, emit_event(engine, wh_tenant), tenants.id))
    assert receiver.requests == []
    assert [a["status_code"] for a in attempts_of(engine, tenants.id)] == [None]
    await deliver(dispatch_job(wh_tenant, emit_event(engine, wh_tenant), operators.id))
    assert len(receiver.requests) == 1
