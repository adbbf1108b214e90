"""Cron entries over HTTP: the seed's schedule rules, delete by name, first firing."""

from __future__ import annotations

from datetime import datetime, timedelta

import httpx
import pytest

from postrelay.core.clock import utcnow
from postrelay.queue.maintenance import CronScheduler
from tests.api.conftest import data, error

CRON = "/v1/functions/cron"


def entries(api: httpx.Client) -> dict[str, dict]:
    # Built-in entries (retention) are named postrelay.*; the tests leave them be.
    return {e["name"]: e for e in data(api.get(CRON)) if not e["name"].startswith("postrelay.")}


def test_five_fields_are_stored_with_zero_seconds_and_runs_start_null(api, tenant):
    entry = data(api.post(CRON, json={
        "name": "nightly-cleanup", "schedule": "*/1 * * * *", "kind": "bulk_import",
        "payload": {"dryRun": False}, "tenantId": str(tenant),
    }), 201)
    assert entry["schedule"] == "0 */1 * * * *"
    assert entry["last_run"] is None and entry["next_run"] is None
    assert entry["payload"] == {"dryRun": False} and entry["kind"] == "bulk_import"
    assert entry["tenant_id"] == str(tenant) and entry["priority"] == 100
    assert entry["max_attempts"] is None
    assert entries(api) == {"nightly-cleanup": entry}


def test_optional_priority_and_max_attempts(api, tenant):
    entry = data(api.post(CRON, json={
        "name": "six", "schedule": "30 0 3 * * *", "kind": "reindex", "tenantId": str(tenant),
        "priority": 0, "maxAttempts": 2,
    }), 201)
    assert entry["schedule"] == "30 0 3 * * *"
    assert (entry["priority"], entry["max_attempts"], entry["payload"]) == (0, 2, {})


@pytest.mark.parametrize("schedule", ["@daily", "@hourly", "* * *", "61 * * * *", "nope"])
def test_aliases_and_malformed_schedules_are_400_naming_the_format(api, tenant, schedule):
    err = error(api.post(CRON, json={"name": "x", "schedule": schedule, "kind": "reindex",
                                     "tenantId": str(tenant)}), 400)
    assert err["field"] == "schedule"
    assert "expected 5 fields 'minute hour day month weekday'" in err["message"]
    assert "6 fields 'second minute hour day month weekday'" in err["message"]
    assert entries(api) == {}


@pytest.mark.parametrize(
    ("body", "field"),
    [({"kind": "nope"}, "kind"), ({"payload": [1]}, "payload"), ({"name": "has space"}, "name"),
     ({"tenantId": "00000000-0000-0000-0000-00000000beef"}, "tenantId"),
     ({"maxAttempts": 0}, "maxAttempts"), ({"extra": 1}, "extra")],
)
def test_bad_entries_are_400_naming_the_field(api, tenant, body, field):
    base = {"name": "x", "schedule": "* * * * *", "kind": "reindex", "tenantId": str(tenant)}
    assert error(api.post(CRON, json={**base, **body}), 400)["field"] == field


def test_names_are_unique_per_tenant_409_only_for_the_same_tenant(api, tenant, other_tenant):
    body = {"name": "report", "schedule": "0 * * * *", "kind": "reindex"}
    data(api.post(CRON, json={**body, "tenantId": str(tenant)}), 201)
    err = error(api.post(CRON, json={**body, "tenantId": str(tenant)}), 409)
    assert err["code"] == "conflict" and "report" in err["message"]
    data(api.post(CRON, json={**body, "tenantId": str(other_tenant)}), 201)
    # The service role deletes by name and tenant when two tenants have the name.
    err = error(api.delete(f"{CRON}/report"), 400)
    assert err["field"] == "tenantId" and "name the tenant" in err["message"]
    data(api.delete(f"{CRON}/report", params={"tenantId": str(other_tenant)}))
    owners = [e["tenant_id"] for e in data(api.get(CRON)) if e["name"] == "report"]
    assert owners == [str(tenant)]


def test_delete_by_name_then_unknown_is_404(api, tenant):
    data(api.post(CRON, json={"name": "doomed", "schedule": "* * * * *", "kind": "reindex",
                              "tenantId": str(tenant)}), 201)
    assert data(api.delete(f"{CRON}/doomed")) == {"name": "doomed", "deleted": True}
    assert entries(api) == {}
    err = error(api.delete(f"{CRON}/doomed"), 404)
    assert err["code"] == "not_found" and "doomed" in err["message"]
    error(api.delete(f"{CRON}/never-existed"), 404)


async def test_last_and_next_run_are_set_by_the_first_firing(api, engine, async_engine, tenant):
    entry = data(api.post(CRON, json={"name": "every-second", "schedule": "* * * * * *",
                                      "kind": "reindex", "payload": {"frozen": 1},
                                      "tenantId": str(tenant)}), 201)
    assert entry["last_run"] is None and entry["next_run"] is None
    now = utcnow() + timedelta(seconds=2)  # the injected clock: no sleeping
    fired = await CronScheduler(async_engine).run_once(now)
    assert "every-second" in [f.name for f in fired]
    after = entries(api)["every-second"]
    slot = now.replace(microsecond=0)
    assert datetime.fromisoformat(after["last_run"]) == slot
    assert datetime.fromisoformat(after["next_run"]) == slot + timedelta(seconds=1)
    (job,) = [j for j in data(api.get("/v1/functions/jobs")) if j["kind"] == "reindex"]
    assert job["payload"] == {"frozen": 1} and job["tenant_id"] == str(tenant)


async def test_an_entry_whose_firings_fail_says_since_when_and_why(api, async_engine, tenant,
                                                                  monkeypatch):
    """Its slot stays due and fails again every round: the listing shows it, not the log
    alone; the next firing that succeeds clears it."""
    data(api.post(CRON, json={"name": "too-big", "schedule": "* * * * * *", "kind": "reindex",
                              "payload": {"blob": "x" * 2000}, "tenantId": str(tenant)}), 201)
    assert entries(api)["too-big"]["failing_since"] is None
    monkeypatch.setenv("POSTRELAY_MAX_PAYLOAD_BYTES", "1024")  # lowered since
    now = utcnow() + timedelta(seconds=2)
    await CronScheduler(async_engine).run_once(now)
    failing = entries(api)["too-big"]
    assert datetime.fromisoformat(failing["failing_since"]) == now
    assert failing["last_error"] == ("payload: is 2011 bytes as JSON, over the limit of 1024 "
                                     "(POSTRELAY_MAX_PAYLOAD_BYTES)")
    assert failing["last_run"] is None
    monkeypatch.delenv("POSTRELAY_MAX_PAYLOAD_BYTES")
    await CronScheduler(async_engine).run_once(now + timedelta(seconds=1))
    fired = entries(api)["too-big"]
    assert fired["failing_since"] is None and fired["last_error"] is None
    assert fired["last_run"] is not None


@pytest.mark.parametrize(("payload", "field"), [
    ({"template": "welcome", "to": ["a@x.example\r\nBcc: evil@x.example"]}, "payload.to[0]"),
    ({"template": "../secrets", "to": ["ann@x.example"]}, "payload.template"),
    ({"template": "welcome", "to": []}, "payload.to"),
])
def test_an_email_send_payload_is_checked_as_a_job_is_at_enqueue(api, tenant, payload, field):
    """Every firing enqueues the payload: a message its first run would fail is a 400 when
    the entry is created, naming the field, and no entry is written."""
    body = {"name": "digest", "schedule": "0 8 * * *", "kind": "email_send",
            "payload": payload, "tenantId": str(tenant)}
    err = error(api.post(CRON, json=body), 400)
    assert err["field"] == field and err["message"].startswith(f"{field}: ")
    assert entries(api) == {}
    good = {"template": "welcome", "to": ["Ann <ann@x.example>"]}
    assert data(api.post(CRON, json=body | {"payload": good}), 201)["kind"] == "email_send"
