"""What the system keeps for itself (postrelay/queue/reserved.py), over real HTTP: the kinds
a tenant key may not enqueue or schedule, the `postrelay.*` cron names, cron names per
tenant, and a retention job that takes no window from its payload."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import text

from postrelay.core.clock import utcnow
from postrelay.core.db import Database, sqlalchemy_url
from postrelay.core.settings import Settings
from postrelay.queue import Registry
from postrelay.queue.maintenance import CronScheduler
from postrelay.queue.schema import SYSTEM_TENANT_ID
from postrelay.runtime import build_worker
from tests.api.conftest import data, error, tenant_key
from tests.factories import insert_job, scalar

JOBS = "/v1/functions/jobs"
CRON = "/v1/functions/cron"
TENANT_REFUSED = ["cleanup_jobs", "email_send", "outbox_dispatch"]


@pytest.fixture
def globex_client(api_url, engine, other_tenant):
    with httpx.Client(base_url=api_url, headers={"apikey": tenant_key(engine, "globex-app",
                                                                      other_tenant)},
                      timeout=30) as client:
        yield client


def jobs_of_kind(engine, kind: str) -> int:
    return scalar(engine, "SELECT count(*) FROM mdm.aa_job WHERE job_kind::text = :k", k=kind)


def cron_count(engine) -> int:
    return scalar(engine, "SELECT count(*) FROM mdm.aa_cron_entry "
                          "WHERE name NOT LIKE 'postrelay.%'")


# --- kinds -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", TENANT_REFUSED)
def test_a_tenant_key_may_not_enqueue_reserved_kinds(acme_client, engine, tenant, kind):
    payload = {"retention_days": 0} if kind == "cleanup_jobs" else {
        "template": "welcome", "to": ["victim@example.com"],
        "from": "Beta Billing <billing@beta.example>", "context": {}}
    for body in ({"kind": kind, "payload": payload},
                 {"kind": kind, "payload": payload, "tenantId": str(tenant)}):
        err = error(acme_client.post(JOBS, json=body), 403)
        assert err["code"] == "kind_reserved"
        assert f"kind {kind!r} is reserved for" in err["message"]
        assert "tenant keys may not enqueue it" in err["message"]
    assert jobs_of_kind(engine, kind) == 0


def test_the_message_names_the_rule(acme_client):
    err = error(acme_client.post(JOBS, json={"kind": "cleanup_jobs"}), 403)
    assert err["message"] == ("kind 'cleanup_jobs' is reserved for the system; tenant keys "
                              "may not enqueue it")


def test_the_service_role_runs_system_kinds_in_the_system_tenant_only(api, engine, tenant):
    err = error(api.post(JOBS, json={"kind": "cleanup_jobs", "tenantId": str(tenant)}), 403)
    assert err["code"] == "kind_reserved" and "system tenant" in err["message"]
    assert jobs_of_kind(engine, "cleanup_jobs") == 0
    job = data(api.post(JOBS, json={"kind": "cleanup_jobs", "payload": {"target": "jobs"}}), 201)
    assert job["tenant_id"] == str(SYSTEM_TENANT_ID)
    # Trusted kinds stay the service role's, for any tenant.
    sent = data(api.post(JOBS, json={"kind": "email_send", "tenantId": str(tenant),
                                     "payload": {"template": "welcome", "to": ["a@x.example"]}}),
                201)
    assert sent["tenant_id"] == str(tenant)


def test_ordinary_kinds_are_still_a_tenant_keys(acme_client, tenant):
    job = data(acme_client.post(JOBS, json={"kind": "reindex", "payload": {"n": 1}}), 201)
    assert job["tenant_id"] == str(tenant)


@pytest.mark.parametrize("kind", TENANT_REFUSED)
def test_a_tenant_key_may_not_schedule_reserved_kinds(acme_client, engine, kind):
    err = error(acme_client.post(CRON, json={"name": "sweep", "schedule": "*/10 * * * * *",
                                             "kind": kind}), 403)
    assert err["code"] == "kind_reserved" and kind in err["message"]
    assert cron_count(engine) == 0


def test_the_service_role_schedules_system_kinds_in_the_system_tenant_only(api, engine,
                                                                           tenant):
    body = {"name": "sweep", "schedule": "0 * * * *", "kind": "cleanup_jobs"}
    err = error(api.post(CRON, json={**body, "tenantId": str(tenant)}), 403)
    assert err["code"] == "kind_reserved"
    entry = data(api.post(CRON, json=body), 201)
    assert entry["tenant_id"] == str(SYSTEM_TENANT_ID)


# --- names -------------------------------------------------------------------------------

def test_postrelay_names_are_the_systems(api, acme_client, engine):
    body = {"schedule": "0 * * * *", "kind": "reindex"}
    for client in (acme_client, api):
        for name in ("postrelay.retention", "postrelay.mine"):
            err = error(client.post(CRON, json={**body, "name": name}), 403)
            assert err["code"] == "name_reserved" and "'postrelay.'" in err["message"]
        err = error(client.delete(f"{CRON}/postrelay.retention"), 403)
        assert err["code"] == "name_reserved"
    assert cron_count(engine) == 0
    assert scalar(engine, "SELECT count(*) FROM mdm.aa_cron_entry "
                          "WHERE name = 'postrelay.retention'") == 1


async def test_two_tenants_each_with_a_nightly_entry_both_fire(acme_client, globex_client,
                                                               engine, async_engine, tenant,
                                                               other_tenant):
    body = {"name": "nightly", "schedule": "* * * * * *", "kind": "reindex"}
    mine = data(acme_client.post(CRON, json=body), 201)
    theirs = data(globex_client.post(CRON, json=body), 201)  # not a 409: another tenant's
    assert (mine["tenant_id"], theirs["tenant_id"]) == (str(tenant), str(other_tenant))
    err = error(acme_client.post(CRON, json=body), 409)  # the caller's own tenant only
    assert "already exists for this tenant" in err["message"]
    assert [e["id"] for e in data(acme_client.get(CRON))] == [mine["id"]]

    fired = await CronScheduler(async_engine).run_once(utcnow() + timedelta(seconds=2))
    assert [f.name for f in fired].count("nightly") == 2
    with engine.connect() as conn:
        owners = conn.execute(text("SELECT tenant_id FROM mdm.aa_job "
                                   "WHERE created_by = 'cron:nightly'")).scalars().all()
    assert sorted(owners) == sorted([tenant, other_tenant])

    data(acme_client.delete(f"{CRON}/nightly"))
    assert [e["id"] for e in data(globex_client.get(CRON))] == [theirs["id"]]
    error(acme_client.delete(f"{CRON}/nightly"), 404)
    # A tenant key cannot name another tenant for a delete.
    err = error(acme_client.delete(f"{CRON}/nightly", params={"tenantId": str(other_tenant)}),
                400)
    assert err["field"] == "tenantId"


# --- the retention handler ---------------------------------------------------------------

async def test_a_retention_job_takes_no_window_from_its_payload(api, engine, database_url,
                                                                tenant, other_tenant):
    now = datetime.now(UTC)
    with engine.begin() as conn:
        recent = [insert_job(conn, tenant_id=t, status="done",
                             completed_at=now - timedelta(days=1)) for t in (tenant, other_tenant)]
        old = insert_job(conn, tenant_id=other_tenant, status="done",
                         completed_at=now - timedelta(days=20))
    job = data(api.post(JOBS, json={"kind": "cleanup_jobs",
                                    "payload": {"target": "jobs", "retention_days": 0}}), 201)
    db = Database(url=sqlalchemy_url(database_url))
    process = build_worker(Settings(database_url=database_url, job_retention_days=14), db,
                           registry=Registry(), maintenance=False, kinds=("cleanup_jobs",))
    await process.start()
    try:
        for _ in range(300):
            if data(api.get(f"{JOBS}/{job['id']}"))["status"] == "done":
                break
            await asyncio.sleep(0.05)
    finally:
        await process.stop()
        db.close()
    assert data(api.get(f"{JOBS}/{job['id']}"))["status"] == "done"
    with engine.connect() as conn:
        left = set(conn.execute(text("SELECT id FROM mdm.aa_job")).scalars())
    assert set(recent) <= left  # inside the configured 14 days, whatever the payload said
    assert old not in left
