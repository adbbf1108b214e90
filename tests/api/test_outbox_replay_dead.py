"""Replaying the events the relay gave up on (`dead`), over HTTP and through the client:
a tenant key reaches its own tenant's only, the filter narrows a range, and every replay
is logged with what was asked, how many and who asked. Events die in a real Relay."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from tests.api.conftest import SERVICE_KEY, data, error, tenant_key
from tests.api.test_client_admin import connect, refused  # noqa: F401 (a fixture)
from tests.api.test_outbox import REPLAY, backdate, emit_order, relay
from tests.dashboard.conftest import insert_event


def status_of(api, event_id: uuid.UUID) -> str:
    return data(api.get(f"/v1/functions/outbox/events/{event_id}"))["status"]


def replays(caplog) -> list[dict]:
    return [r.fields for r in caplog.records
            if getattr(r, "event", None) == "postrelay.api.outbox_replay"]


async def test_a_tenant_key_replays_its_own_dead_events_only(api, engine, async_engine, tenant,
                                                             other_tenant, acme_client, caplog):
    mine_dead = emit_order(engine, tenant, 1, "order.broken")
    mine_handled = emit_order(engine, tenant, 2)
    theirs_dead = emit_order(engine, other_tenant, 3, "order.broken")
    await relay(async_engine).run_once()
    assert {status_of(api, e) for e in (mine_dead, theirs_dead)} == {"dead"}
    caplog.set_level(logging.INFO, logger="postrelay")

    assert data(acme_client.post(REPLAY, json={"dead": True})) == {"replayed": 1}
    assert status_of(api, mine_dead) == "pending"
    assert status_of(api, mine_handled) == "handled"  # not dead: left alone
    assert status_of(api, theirs_dead) == "dead"  # another tenant's: out of reach
    (logged,) = replays(caplog)
    assert logged == {"replayed": 1, "actor": "api:key:acme-app", "tenant_id": str(tenant),
                      "event_id": None, "since": None, "until": None, "dead": True}


async def test_dead_narrows_a_range(api, engine, async_engine, tenant, other_tenant, caplog):
    old_dead = emit_order(engine, other_tenant, 4, "order.broken")
    new_dead = emit_order(engine, tenant, 5, "order.broken")
    old_handled = emit_order(engine, tenant, 6)
    await relay(async_engine).run_once()
    for event_id in (old_dead, old_handled):
        backdate(engine, event_id, 7200)
    hour_ago = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    caplog.set_level(logging.INFO, logger="postrelay")

    # Before an hour ago: the old dead event, not the old handled one beside it.
    assert data(api.post(REPLAY, json={"dead": True, "until": hour_ago})) == {"replayed": 1}
    assert (status_of(api, old_dead), status_of(api, old_handled)) == ("pending", "handled")
    assert status_of(api, new_dead) == "dead"
    # The service role, alone: every tenant's dead events.
    assert data(api.post(REPLAY, json={"dead": True})) == {"replayed": 1}
    assert status_of(api, new_dead) == "pending"
    first, second = replays(caplog)
    assert (first["actor"], first["tenant_id"], first["dead"]) == ("api:service-role", None, True)
    assert first["until"] == hour_ago and first["since"] is None
    assert (second["replayed"], second["until"]) == (1, None)
    # Nothing dead left: a dead replay matches nothing.
    assert data(api.post(REPLAY, json={"dead": True})) == {"replayed": 0}


@pytest.mark.parametrize(("body", "field"), [
    ({"dead": True, "eventId": str(uuid.UUID(int=1))}, "dead"),
    ({"dead": "yes"}, "dead"),  # strict: only a JSON true
    ({"dead": 1}, "dead"),
    ({"dead": False}, "eventId"),  # asks for nothing
])
def test_dead_bad_input_names_the_field(api, tenant, body, field):
    assert error(api.post(REPLAY, json=body), 400)["field"] == field


def test_the_clients_replay_dead_events_within_the_keys_tenant(connect, engine, tenant,  # noqa: F811
                                                                other_tenant):
    """Client and AsyncClient alike (the `connect` fixture makes each)."""
    admin, acme = connect(SERVICE_KEY), connect(tenant_key(engine, "acme-app", tenant))
    now = datetime.now(UTC)
    with engine.begin() as conn:
        mine = insert_event(conn, tenant, dead_at=now, attempts=10, last_error="boom")
        theirs = insert_event(conn, other_tenant, dead_at=now, attempts=10, last_error="boom")
        insert_event(conn, tenant, handled_at=now)
    assert acme.replay_outbox(dead=True) == 1
    assert acme.get_outbox_event(mine)["status"] == "pending"
    assert admin.get_outbox_event(theirs)["status"] == "dead"
    assert admin.replay_outbox(since=now - timedelta(hours=1), dead=True) == 1
    assert admin.get_outbox_event(theirs)["status"] == "pending"
    with refused(400, field="dead"):
        admin.replay_outbox(mine, dead=True)
