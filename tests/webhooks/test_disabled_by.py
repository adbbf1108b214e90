"""Who disabled an endpoint, and what a tenant may enable: an operator's disable (no
tenant_id) is the operator's to lift; a tenant enables what it or the receiver (a 410 Gone,
through the real handler) disabled. Sync and async connections alike."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from postrelay.core.errors import ForbiddenError
from postrelay.queue import StopJob
from postrelay.relay.webhooks import webhook_add, webhook_disable, webhook_enable, webhook_get
from tests.webhooks.helpers import add_endpoint, dispatch_job, emit_event
from tests.webhooks.receiver import Answer
from tests.webhooks.test_handler import handler_for

URL = "https://example.com/hooks"


def row(engine, endpoint_id) -> tuple:
    """The stored row as it is, `updated_at` included: "nothing written" is checked on it."""
    with engine.connect() as conn:
        return tuple(conn.execute(text(
            "SELECT enabled, disabled_reason, disabled_by, updated_at "
            "FROM mdm.aa_webhook_endpoint WHERE id = :e"), {"e": endpoint_id}).one())


def test_a_tenant_cannot_enable_what_an_operator_disabled(engine, wh_tenant):
    with engine.begin() as conn:
        endpoint, _ = webhook_add(conn, wh_tenant, URL)
        assert endpoint.disabled_by is None
    with engine.begin() as conn:
        disabled = webhook_disable(conn, endpoint.id, reason="floods its receiver")
    assert (disabled.enabled, disabled.disabled_by) == (False, "operator")
    before = row(engine, endpoint.id)
    with engine.begin() as conn, pytest.raises(ForbiddenError) as refused:
        webhook_enable(conn, endpoint.id, tenant_id=wh_tenant)
    assert refused.value.code == "disabled_by_operator"
    assert "disabled by an operator" in refused.value.message
    assert "only an operator enables it" in refused.value.message
    assert row(engine, endpoint.id) == before  # nothing written
    with engine.begin() as conn:
        enabled = webhook_enable(conn, endpoint.id)  # the operator may
    assert (enabled.enabled, enabled.disabled_reason, enabled.disabled_by) == (
        True, None, None)


def test_a_tenant_s_disable_leaves_an_operator_s_disable_as_it_is(engine, wh_tenant):
    with engine.begin() as conn:
        endpoint, _ = webhook_add(conn, wh_tenant, URL)
        webhook_disable(conn, endpoint.id, reason="abuse")
    before = row(engine, endpoint.id)
    with engine.begin() as conn:
        answered = webhook_disable(conn, endpoint.id, reason="mine now", tenant_id=wh_tenant)
    assert (answered.enabled, answered.disabled_reason, answered.disabled_by) == (
        False, "abuse", "operator")
    assert row(engine, endpoint.id) == before
    with engine.begin() as conn, pytest.raises(ForbiddenError):
        webhook_enable(conn, endpoint.id, tenant_id=wh_tenant)


def test_a_tenant_enables_what_it_disabled_and_an_operator_takes_a_disable_over(
        engine, wh_tenant):
    with engine.begin() as conn:
        endpoint, _ = webhook_add(conn, wh_tenant, URL)
        mine = webhook_disable(conn, endpoint.id, reason="receiver moving",
                               tenant_id=wh_tenant)
        assert (mine.enabled, mine.disabled_by) == (False, "tenant")
        again = webhook_enable(conn, endpoint.id, tenant_id=wh_tenant)
        assert (again.enabled, again.disabled_by) == (True, None)
        unsaid = webhook_disable(conn, endpoint.id, tenant_id=wh_tenant)
        assert (unsaid.disabled_reason, unsaid.disabled_by) == (
            "disabled by the tenant", "tenant")
        taken = webhook_disable(conn, endpoint.id, reason="abuse")
        assert (taken.disabled_reason, taken.disabled_by) == ("abuse", "operator")
        with pytest.raises(ForbiddenError):
            webhook_enable(conn, endpoint.id, tenant_id=wh_tenant)


async def test_async_connections_keep_the_rule_too(engine, async_engine, wh_tenant):
    with engine.begin() as conn:
        endpoint, _ = webhook_add(conn, wh_tenant, URL)
    async with async_engine.begin() as conn:
        await webhook_disable(conn, endpoint.id)
        kept = await webhook_disable(conn, endpoint.id, reason="x", tenant_id=wh_tenant)
        assert (kept.disabled_reason, kept.disabled_by) == (
            "disabled by an operator", "operator")
        with pytest.raises(ForbiddenError):
            await webhook_enable(conn, endpoint.id, tenant_id=wh_tenant)
    async with async_engine.begin() as conn:
        assert (await webhook_get(conn, endpoint.id)).enabled is False


async def test_a_tenant_enables_what_the_receiver_disabled_with_a_410(
        engine, async_engine, wh_tenant, receiver):
    endpoint_id, receiver.secret = add_endpoint(engine, wh_tenant, receiver.url())
    receiver.program(Answer(410, body=b"gone"))
    with pytest.raises(StopJob, match="410"):
        await handler_for(async_engine)(
            dispatch_job(wh_tenant, emit_event(engine, wh_tenant), endpoint_id))
    enabled, reason, by, _ = row(engine, endpoint_id)
    assert (enabled, by) == (False, "receiver") and reason.startswith("410 Gone at ")
    with engine.begin() as conn:
        again = webhook_enable(conn, endpoint_id, tenant_id=wh_tenant)
    assert (again.enabled, again.disabled_by) == (True, None)


def test_the_table_keeps_who_and_enabled_in_step(engine, wh_tenant):
    with engine.begin() as conn:
        endpoint, _ = webhook_add(conn, wh_tenant, URL)
    for change in ("enabled = false",  # disabled by nobody
                   "disabled_by = 'tenant'",  # enabled, yet disabled by someone
                   "enabled = false, disabled_by = 'admin'"):  # not one of the three
        with engine.begin() as conn, pytest.raises(IntegrityError, match="disabled_by"):
            conn.execute(text(f"UPDATE mdm.aa_webhook_endpoint SET {change} WHERE id = :e"),
                         {"e": endpoint.id})
