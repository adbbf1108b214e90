"""Who disabled a webhook endpoint, over HTTP: what the operator disabled (the service-role
key, the CLI) a tenant key cannot enable (403 `disabled_by_operator`, nothing changed) nor
take over with a disable of its own; what the tenant key or the receiver (410 Gone)
disabled, it enables."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sqlalchemy import text

from postrelay.relay.webhooks.endpoints import WEBHOOK_SQL
from tests.api.conftest import data, error
from tests.api.test_webhooks import HOOKS, add

POSTRELAY = str(Path(sys.executable).parent / "postrelay")


def stored(engine, endpoint_id: str) -> tuple:
    with engine.connect() as conn:
        return tuple(conn.execute(text(
            "SELECT enabled, disabled_reason, disabled_by, updated_at "
            "FROM mdm.aa_webhook_endpoint WHERE id = :e"), {"e": endpoint_id}).one())


def test_a_tenant_key_cannot_enable_what_the_service_role_disabled(api, acme_client, engine):
    endpoint = add(acme_client)["endpoint"]
    assert endpoint["disabled_by"] is None
    one = f"{HOOKS}/{endpoint['id']}"
    disabled = data(api.post(f"{one}/disable"))
    assert (disabled["enabled"], disabled["disabled_by"], disabled["disabled_reason"]) == (
        False, "operator", "disabled by api:service-role")
    before = stored(engine, endpoint["id"])

    err = error(acme_client.post(f"{one}/enable"), 403)
    assert err["code"] == "disabled_by_operator", err
    assert f"webhook endpoint {endpoint['id']} was disabled by an operator" in err["message"]
    assert "only an operator enables it" in err["message"]
    assert stored(engine, endpoint["id"]) == before  # still disabled, nothing written
    assert data(acme_client.get(one))["enabled"] is False

    # Its own disable answers the endpoint as it is: the disable stays the operator's.
    kept = data(acme_client.post(f"{one}/disable"))
    assert (kept["enabled"], kept["disabled_by"], kept["disabled_reason"]) == (
        False, "operator", "disabled by api:service-role")
    assert stored(engine, endpoint["id"]) == before
    assert error(acme_client.post(f"{one}/enable"), 403)["code"] == "disabled_by_operator"

    enabled = data(api.post(f"{one}/enable"))  # the service role enables it
    assert (enabled["enabled"], enabled["disabled_by"], enabled["disabled_reason"]) == (
        True, None, None)


def test_a_tenant_key_cannot_enable_what_the_cli_disabled(acme_client, engine, worker_env):
    endpoint = add(acme_client)["endpoint"]
    cli = subprocess.run([POSTRELAY, "webhooks", "disable", endpoint["id"], "--reason",
                          "receiver under attack"], env=worker_env, capture_output=True,
                         text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    err = error(acme_client.post(f"{HOOKS}/{endpoint['id']}/enable"), 403)
    assert err["code"] == "disabled_by_operator" and "receiver under attack" in err["message"]
    listed = subprocess.run([POSTRELAY, "webhooks", "list"], env=worker_env,
                            capture_output=True, text=True, timeout=60)
    header, line = listed.stdout.splitlines()[:2]
    assert "BY" in header.split() and "operator" in line.split(), listed.stdout


def test_a_tenant_key_enables_what_it_disabled(acme_client):
    endpoint = add(acme_client)["endpoint"]
    one = f"{HOOKS}/{endpoint['id']}"
    disabled = data(acme_client.post(f"{one}/disable"))
    assert (disabled["enabled"], disabled["disabled_by"]) == (False, "tenant")
    enabled = data(acme_client.post(f"{one}/enable"))
    assert (enabled["enabled"], enabled["disabled_by"], enabled["disabled_reason"]) == (
        True, None, None)


def test_the_service_role_takes_a_tenant_s_disable_over(api, acme_client):
    endpoint = add(acme_client)["endpoint"]
    one = f"{HOOKS}/{endpoint['id']}"
    data(acme_client.post(f"{one}/disable"))
    taken = data(api.post(f"{one}/disable"))
    assert (taken["disabled_by"], taken["disabled_reason"]) == (
        "operator", "disabled by api:service-role")
    assert error(acme_client.post(f"{one}/enable"), 403)["code"] == "disabled_by_operator"


def test_a_tenant_key_enables_what_its_receiver_disabled_with_a_410(acme_client, engine):
    endpoint = add(acme_client)["endpoint"]
    with engine.begin() as conn:  # the statement the worker runs on a 410 Gone
        conn.execute(WEBHOOK_SQL["webhook_endpoint_disable_gone"],
                     {"id": endpoint["id"], "reason": "410 Gone at 2026-12-09T10:00:00+00:00"})
    one = f"{HOOKS}/{endpoint['id']}"
    found = data(acme_client.get(one))
    assert (found["enabled"], found["disabled_by"]) == (False, "receiver")
    enabled = data(acme_client.post(f"{one}/enable"))
    assert (enabled["enabled"], enabled["disabled_by"]) == (True, None)
