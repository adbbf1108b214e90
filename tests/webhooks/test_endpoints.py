"""Managing endpoints: the functions (sync and async connections) and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

from postrelay.core.errors import NotFoundError, ValidationError
from postrelay.queue import ensure_tenant
from postrelay.relay.webhooks import (
    webhook_add,
    webhook_attempts,
    webhook_disable,
    webhook_enable,
    webhook_get,
    webhook_list,
    webhook_remove,
)
from postrelay.relay.webhooks.signing import secret_key
from tests.factories import insert_attempt

POSTRELAY = str(Path(sys.executable).parent / "postrelay")


def test_add_list_disable_enable_remove(engine, wh_tenant):
    with engine.begin() as conn:
        endpoint, secret = webhook_add(conn, wh_tenant, "https://example.com/hooks",
                                       event_types=["order.*"])
    assert len(secret_key(secret)) == 32
    assert endpoint.enabled and endpoint.event_types == ["order.*"]
    assert not hasattr(endpoint, "secret")
    with engine.begin() as conn:
        disabled = webhook_disable(conn, endpoint.id, reason="maintenance")
        assert (disabled.enabled, disabled.disabled_reason) == (False, "maintenance")
        enabled = webhook_enable(conn, str(endpoint.id))
        assert (enabled.enabled, enabled.disabled_reason) == (True, None)
        assert [e.id for e in webhook_list(conn, tenant_id=wh_tenant)] == [endpoint.id]
        assert webhook_list(conn, tenant_id=uuid.uuid4()) == []
        with pytest.raises(NotFoundError):
            webhook_disable(conn, endpoint.id, tenant_id=uuid.uuid4())  # not that tenant's
        webhook_remove(conn, endpoint.id)
        with pytest.raises(NotFoundError):
            webhook_remove(conn, endpoint.id)


def test_get_and_the_attempts_held_to_a_tenant(engine, wh_tenant):
    with engine.begin() as conn:
        other = ensure_tenant(conn, "globex")
        mine, _ = webhook_add(conn, wh_tenant, "https://example.com/mine")
        theirs, _ = webhook_add(conn, other, "https://example.com/theirs")
        event = insert_attempt(conn, mine.id)
        insert_attempt(conn, theirs.id, event_id=event)  # the same event id, on both
    with engine.begin() as conn:
        assert webhook_get(conn, str(mine.id)) == mine
        assert webhook_get(conn, mine.id, tenant_id=wh_tenant) == mine
        with pytest.raises(NotFoundError):
            webhook_get(conn, theirs.id, tenant_id=wh_tenant)  # not that tenant's
        with pytest.raises(NotFoundError):
            webhook_get(conn, uuid.uuid4())
        with pytest.raises(ValidationError) as info:
            webhook_get(conn, "nope")
        assert info.value.field == "endpoint_id"
        assert {a.endpoint_id for a in webhook_attempts(conn, event_id=event)} == {
            mine.id, theirs.id}
        held = webhook_attempts(conn, event_id=event, tenant_id=wh_tenant)
        assert [a.endpoint_id for a in held] == [mine.id]
        assert webhook_attempts(conn, endpoint_id=theirs.id, tenant_id=wh_tenant) == []


async def test_async_connection_and_caller_transaction(engine, async_engine, wh_tenant):
    async with async_engine.connect() as conn, conn.begin() as txn:
        endpoint, _ = await webhook_add(conn, wh_tenant, "http://example.com/x")
        assert [e.id for e in await webhook_list(conn)] == [endpoint.id]
        await txn.rollback()  # the caller decides: nothing was committed
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_webhook_endpoint")).scalar() == 0


def test_bad_input_names_the_field_and_writes_nothing(engine, wh_tenant):
    with engine.begin() as conn:
        for call, field in [
            (lambda: webhook_add(conn, uuid.uuid4(), "https://example.com/"), "tenant_id"),
            (lambda: webhook_add(conn, "nope", "https://example.com/"), "tenant_id"),
            (lambda: webhook_add(conn, wh_tenant, "gopher://example.com/"), "url"),
            (lambda: webhook_add(conn, wh_tenant, "https://x.com/", event_types=[""]),
             "event_types"),
            (lambda: webhook_disable(conn, wh_tenant, reason=" "), "reason"),
            # What PostgreSQL cannot store is refused before it aborts the transaction.
            (lambda: webhook_add(conn, wh_tenant, "https://x.com/", event_types=["a\x00"]),
             "event_types"),
            (lambda: webhook_add(conn, wh_tenant, "https://x.com/", event_types=["a\udcff"]),
             "event_types"),
            (lambda: webhook_disable(conn, wh_tenant, reason="gone\x00"), "reason"),
        ]:
            with pytest.raises(ValidationError) as info:
                call()
            assert info.value.field == field
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_webhook_endpoint")).scalar() == 0


def run(env, *args):
    return subprocess.run([POSTRELAY, *args], env=env, capture_output=True, text=True, timeout=60)


def test_cli_add_list_disable_enable_rm(worker_env, wh_tenant):
    added = run(worker_env, "webhooks", "add", "--tenant", str(wh_tenant),
                "https://example.com/hooks", "--event-type", "order.*",
                "--event-type", "user.created")
    assert added.returncode == 0, added.stderr
    secret = next(line.split(": ", 1)[1] for line in added.stdout.splitlines()
                  if line.startswith("secret: "))
    assert secret.startswith("whsec_")
    listed = run(worker_env, "webhooks", "list", "--json", "--tenant", str(wh_tenant))
    (endpoint,) = json.loads(listed.stdout)
    assert endpoint["event_types"] == ["order.*", "user.created"] and endpoint["enabled"]
    assert secret not in listed.stdout  # shown once, never listed
    endpoint_id = endpoint["id"]
    assert run(worker_env, "webhooks", "disable", endpoint_id, "--reason", "x").returncode == 0
    table = run(worker_env, "webhooks", "list").stdout
    assert "disabled" in table and endpoint_id in table
    assert run(worker_env, "webhooks", "enable", endpoint_id).returncode == 0
    assert run(worker_env, "webhooks", "attempts", "--endpoint", endpoint_id).stdout.strip() \
        == "no attempts"
    assert run(worker_env, "webhooks", "rm", endpoint_id).returncode == 0
    gone = run(worker_env, "webhooks", "rm", endpoint_id)
    assert gone.returncode == 1 and "no webhook endpoint" in gone.stderr
    bad = run(worker_env, "webhooks", "add", "--tenant", str(wh_tenant), "ftp://example.com")
    assert bad.returncode == 1 and "URL:" in bad.stderr


# URLs that httpx cannot parse, that parsers read differently, and every IPv6 form that
# embeds a loopback or private IPv4 address (issue 18): refused at `webhooks add`, with the
# field named and nothing written, so no delivery ever meets them.
REFUSED_AT_ADD = [
    "http://0177.0.0.1:8000/x", "http://\u2460\u2461\u2466.0.0.1:8000/x",
    "http://2130706433:8000/x", "http://example.com:99999/x",
    "http://[::7f00:1]:8000/x", "http://[::ffff:127.0.0.1]:8000/x",
    "http://[::ffff:0:7f00:1]:8000/x", "http://[64:ff9b::7f00:1]:8000/x",
    "http://[64:ff9b:1::1]:8000/x", "http://[2002:7f00:1::]:8000/x",
    "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]:8000/x", "http://[fec0::1]:8000/x",
]


def test_cli_add_refuses_unparseable_urls_and_embedded_private_addresses(worker_env, engine,
                                                                          wh_tenant):
    env = {k: v for k, v in worker_env.items() if k != "POSTRELAY_WEBHOOK_ALLOW_PRIVATE"}
    for url in REFUSED_AT_ADD:
        refused = run(env, "webhooks", "add", "--tenant", str(wh_tenant), url)
        assert refused.returncode == 1, (url, refused.stdout)
        assert refused.stderr.startswith("error: URL: ") and "Traceback" not in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_webhook_endpoint")).scalar() == 0
    # The loopback forms are fine where the operator allowed private addresses ...
    allowed = run({**env, "POSTRELAY_WEBHOOK_ALLOW_PRIVATE": "true"}, "webhooks", "add",
                  "--tenant", str(wh_tenant), "http://[::ffff:127.0.0.1]:8000/x", "--json")
    assert allowed.returncode == 0, allowed.stderr
    # ... and the URL is stored as httpx sends it.
    assert json.loads(allowed.stdout)["endpoint"]["url"] == "http://[::ffff:127.0.0.1]:8000/x"
    # An unparseable URL is refused even then.
    still = run({**env, "POSTRELAY_WEBHOOK_ALLOW_PRIVATE": "true"}, "webhooks", "add",
                "--tenant", str(wh_tenant), "http://0177.0.0.1:8000/x")
    assert still.returncode == 1 and "URL:" in still.stderr
