"""Deliveries to a real HTTPS receiver on loopback whose certificate a private CA (made by the
test) signed: refused without that CA, delivered with it, refused for a certificate that
names another host, and the address guard as before."""

from __future__ import annotations

import uuid

import pytest
import trustme
from sqlalchemy import text

from postrelay.relay.webhooks import (
    WebhookDeliveryError,
    webhook_add,
    webhook_handler,
    webhook_set_ca,
)
from postrelay.relay.webhooks.netguard import AddressRefused
from postrelay.relay.webhooks.trust import BadEndpointCa
from tests.httpserver import serving_https
from tests.webhooks.helpers import as_worker_runs, attempts_of, dispatch_job, emit_event
from tests.webhooks.receiver import Receiver


def pem(ca: trustme.CA) -> str:
    return ca.cert_pem.bytes().decode("ascii")


def add(engine, tenant: uuid.UUID, url: str, receiver: Receiver, ca_pem: str | None = None):
    with engine.begin() as conn:
        endpoint, secret = webhook_add(conn, tenant, url, allow_private=True, ca_pem=ca_pem)
    receiver.secret = secret
    return endpoint.id


async def deliver(async_engine, engine, tenant, endpoint_id, *, allow_private: bool = True):
    event_id = emit_event(engine, tenant)
    handler = as_worker_runs(webhook_handler(async_engine, allow_private=allow_private),
                             async_engine)
    await handler(dispatch_job(tenant, event_id, endpoint_id))


def localhost(url: str) -> str:
    """The receiver by name, so that the certificate's host name is what is checked."""
    return url.replace("127.0.0.1", "localhost") + "/hook"


async def test_without_the_ca_it_fails_with_a_certificate_error_and_with_it_delivers(
        engine, async_engine, wh_tenant, receiver, ca):
    with serving_https(receiver.handler_class(), ca, "localhost") as base:
        endpoint_id = add(engine, wh_tenant, localhost(base), receiver)
        with pytest.raises(WebhookDeliveryError, match="CERTIFICATE_VERIFY_FAILED"):
            await deliver(async_engine, engine, wh_tenant, endpoint_id)
        (refused,) = attempts_of(engine, endpoint_id)
        assert refused["status_code"] is None
        assert "CERTIFICATE_VERIFY_FAILED" in refused["error"]
        assert receiver.requests == []  # nothing reached the receiver

        with engine.begin() as conn:
            assert webhook_set_ca(conn, endpoint_id, pem(ca)).private_ca
        await deliver(async_engine, engine, wh_tenant, endpoint_id)
        (request,) = receiver.requests
        assert request.verified and request.headers["host"].startswith("localhost:")
        assert [a["status_code"] for a in attempts_of(engine, endpoint_id)] == [None, 200]

        # Cleared: the default CAs again, which do not know this one.
        with engine.begin() as conn:
            assert not webhook_set_ca(conn, endpoint_id, None).private_ca
        with pytest.raises(WebhookDeliveryError, match="CERTIFICATE_VERIFY_FAILED"):
            await deliver(async_engine, engine, wh_tenant, endpoint_id)
        assert len(receiver.requests) == 1


async def test_an_endpoint_added_with_its_ca_is_delivered(engine, async_engine, wh_tenant,
                                                          receiver, ca):
    with serving_https(receiver.handler_class(), ca, "localhost") as base:
        endpoint_id = add(engine, wh_tenant, localhost(base), receiver, pem(ca))
        await deliver(async_engine, engine, wh_tenant, endpoint_id)
    (request,) = receiver.requests
    assert request.verified


async def test_a_certificate_for_another_host_from_the_same_ca_is_refused(
        engine, async_engine, wh_tenant, receiver, ca):
    with serving_https(receiver.handler_class(), ca, "receiver.internal.example") as base:
        endpoint_id = add(engine, wh_tenant, localhost(base), receiver, pem(ca))
        with pytest.raises(WebhookDeliveryError, match="CERTIFICATE_VERIFY_FAILED"):
            await deliver(async_engine, engine, wh_tenant, endpoint_id)
    (attempt,) = attempts_of(engine, endpoint_id)
    assert "Hostname mismatch" in attempt["error"]
    assert receiver.requests == []


async def test_another_ca_is_not_trusted_and_the_default_cas_are_not_either(
        engine, async_engine, wh_tenant, receiver, ca):
    """The endpoint's CA replaces the default bundle: a certificate from any other CA
    fails, however it is vouched for elsewhere."""
    with serving_https(receiver.handler_class(), ca, "localhost") as base:
        endpoint_id = add(engine, wh_tenant, localhost(base), receiver, pem(trustme.CA()))
        with pytest.raises(WebhookDeliveryError, match="CERTIFICATE_VERIFY_FAILED"):
            await deliver(async_engine, engine, wh_tenant, endpoint_id)
    assert receiver.requests == []


async def test_the_address_guard_is_unchanged_by_a_ca(engine, async_engine, wh_tenant,
                                                       receiver, ca):
    with serving_https(receiver.handler_class(), ca, "localhost") as base:
        endpoint_id = add(engine, wh_tenant, localhost(base), receiver, pem(ca))
        with pytest.raises(AddressRefused, match="non-public address"):
            await deliver(async_engine, engine, wh_tenant, endpoint_id, allow_private=False)
    assert receiver.requests == []


async def test_a_stored_ca_that_no_longer_loads_stops_the_delivery(
        engine, async_engine, wh_tenant, receiver, ca):
    with serving_https(receiver.handler_class(), ca, "localhost") as base:
        endpoint_id = add(engine, wh_tenant, localhost(base), receiver, pem(ca))
        with engine.begin() as conn:  # edited by hand in the database
            conn.execute(text("UPDATE mdm.aa_webhook_endpoint SET ca_pem = '-----BEGIN "
                              "CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n'"))
        with pytest.raises(BadEndpointCa, match="set-ca"):
            await deliver(async_engine, engine, wh_tenant, endpoint_id)
    (attempt,) = attempts_of(engine, endpoint_id)
    assert "cannot be loaded" in attempt["error"]
    assert receiver.requests == []


async def test_a_refused_certificate_ends_the_attempt_without_trying_other_addresses(
        engine, async_engine, wh_tenant, receiver, ca, dns):
    """The name's first address presents a certificate the endpoint's CA did not sign: that
    is the receiver's identity failing, not the route to it, so its second address (whose
    certificate would pass) is not tried, and the attempt ends with the verification error."""
    other = Receiver()
    untrusted = trustme.CA()
    with serving_https(receiver.handler_class(), untrusted, "hooks.test") as base:
        port = int(base.rsplit(":", 1)[1])
        with serving_https(other.handler_class(), ca, "hooks.test", bind="127.0.0.2",
                           port=port):
            dns["hooks.test"] = ["127.0.0.1", "127.0.0.2"]
            endpoint_id = add(engine, wh_tenant, f"https://hooks.test:{port}/hook", receiver,
                              pem(ca))
            other.secret = receiver.secret
            with pytest.raises(WebhookDeliveryError, match="CERTIFICATE_VERIFY_FAILED"):
                await deliver(async_engine, engine, wh_tenant, endpoint_id)
    assert receiver.requests == [] and other.requests == []
    (attempt,) = attempts_of(engine, endpoint_id)
    assert "CERTIFICATE_VERIFY_FAILED" in attempt["error"]
