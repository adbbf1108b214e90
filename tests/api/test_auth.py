"""Keys: the service-role key sees everything; a tenant key only its tenant's jobs and cron
entries, and another tenant's job is a 404; no or a wrong key is a 401."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import httpx
import pytest
from sqlalchemy import text

from postrelay.access.keys import api_key_revoke
from postrelay.api import create_app
from postrelay.core.db import Database, sqlalchemy_url
from postrelay.core.errors import ConfigError
from postrelay.core.settings import Settings
from tests.api.conftest import SERVICE_KEY, data, error, tenant_key
from tests.factories import audit_rows, insert_job

SOME_ID = uuid.UUID(int=1)
PROTECTED = [
    ("GET", "/v1/functions/jobs"), ("POST", "/v1/functions/jobs"),
    ("GET", f"/v1/functions/jobs/{SOME_ID}"), ("GET", "/v1/functions/jobs/dlq"),
    ("POST", f"/v1/functions/jobs/{SOME_ID}/retry"),
    ("POST", "/v1/functions/jobs/dlq/requeue"), ("DELETE", f"/v1/functions/jobs/{SOME_ID}"),
    ("GET", "/v1/functions/cron"), ("POST", "/v1/functions/cron"),
    ("DELETE", "/v1/functions/cron/x"), ("GET", "/metrics"),
]


@pytest.mark.parametrize(("method", "path"), PROTECTED)
def test_no_key_is_401(anonymous, method, path):
    err = error(anonymous.request(method, path, json={}), 401)
    assert err["code"] == "unauthorized" and "apikey" in err["message"]


@pytest.mark.parametrize("headers", [
    {"apikey": "wrong"}, {"authorization": "Bearer wrong"}, {"apikey": SERVICE_KEY + "x"},
    {"authorization": f"Basic {SERVICE_KEY}"}, {"apikey": ""},
])
def test_wrong_key_is_401(anonymous, headers):
    error(anonymous.get("/v1/functions/jobs", headers=headers), 401)


def test_the_key_as_apikey_or_bearer_or_both(anonymous):
    data(anonymous.get("/v1/functions/jobs", headers={"apikey": SERVICE_KEY}))
    data(anonymous.get("/v1/functions/jobs", headers={"authorization": f"Bearer {SERVICE_KEY}"}))
    data(anonymous.get("/v1/functions/jobs", headers={"apikey": SERVICE_KEY,
                                                      "authorization": f"bearer {SERVICE_KEY}"}))


@pytest.mark.parametrize("authorization", ["Bearer other", f"Basic {SERVICE_KEY}", "Bearer"])
def test_a_second_header_with_another_key_is_refused(anonymous, authorization):
    err = error(anonymous.get("/v1/functions/jobs", headers={"apikey": SERVICE_KEY,
                                                             "authorization": authorization}), 401)
    assert "Authorization" in err["message"]


@pytest.mark.parametrize("headers", [
    [("apikey", SERVICE_KEY), ("apikey", "other")],
    [("apikey", "other"), ("apikey", SERVICE_KEY)],
    [("authorization", f"Bearer {SERVICE_KEY}"), ("authorization", "Bearer other")],
    [("authorization", f"Bearer {SERVICE_KEY}"), ("authorization", "Basic x")],
])
def test_a_header_repeated_with_another_key_is_refused(anonymous, headers):
    """The first value alone decided: the service-role key followed by any other passed."""
    err = error(anonymous.get("/v1/functions/jobs", headers=headers), 401)
    assert "apikey" in err["message"] or "Authorization" in err["message"]
    data(anonymous.get("/v1/functions/jobs", headers=[("apikey", SERVICE_KEY)] * 2))


def test_create_app_refuses_to_run_without_a_key(database_url):
    db = Database(url=sqlalchemy_url(database_url))
    for key in (None, "", "   "):
        with pytest.raises(ConfigError, match="POSTRELAY_SERVICE_ROLE_KEY"):
            create_app(Settings(database_url=database_url, service_role_key=key), db)
    db.close()


def test_create_app_refuses_a_short_or_padded_key(database_url):
    """Issue 18: `POSTRELAY_SERVICE_ROLE_KEY=a` started, and `apikey: a` worked."""
    db = Database(url=sqlalchemy_url(database_url))
    for key, rule in (("a", "at least 32 characters long (it has 1)"),
                      ("k" * 31, "at least 32 characters long (it has 31)"),
                      (" " + "k" * 40, "whitespace"),
                      ("ключ-" + "k" * 40, "printable ASCII"),
                      ("k" * 20 + "\x07" + "k" * 20, "printable ASCII")):
        with pytest.raises(ConfigError, match="POSTRELAY_SERVICE_ROLE_KEY") as info:
            create_app(Settings(database_url=database_url, service_role_key=key), db)
        assert rule in str(info.value)
    create_app(Settings(database_url=database_url, service_role_key="k" * 32), db)
    db.close()


def test_a_tenant_key_sees_only_its_tenants_jobs(api, acme_client, engine, tenant, other_tenant):
    with engine.begin() as conn:
        mine = insert_job(conn, tenant_id=tenant)
        theirs = insert_job(conn, tenant_id=other_tenant)
        theirs_dead = insert_job(conn, tenant_id=other_tenant, status="dlq", attempts=8,
                                 completed_at=datetime.now(UTC))
    assert data(acme_client.get(f"/v1/functions/jobs/{mine}"))["id"] == str(mine)
    err = error(acme_client.get(f"/v1/functions/jobs/{theirs}"), 404)
    assert err["message"] == f"no job {theirs}"  # the same answer as for a missing job
    assert [j["id"] for j in data(acme_client.get("/v1/functions/jobs"))] == [str(mine)]
    assert data(acme_client.get("/v1/functions/jobs/dlq")) == []
    error(acme_client.post(f"/v1/functions/jobs/{theirs_dead}/retry"), 404)
    error(acme_client.delete(f"/v1/functions/jobs/{theirs_dead}"), 404)
    assert data(acme_client.post("/v1/functions/jobs/dlq/requeue")) == {"requeued": 0}
    assert data(api.get(f"/v1/functions/jobs/{theirs_dead}"))["status"] == "dlq"
    # The service role sees both tenants.
    assert len(data(api.get("/v1/functions/jobs"))) == 3


def test_a_tenant_key_enqueues_for_its_own_tenant(acme_client, engine, tenant, other_tenant):
    job = data(acme_client.post("/v1/functions/jobs", json={"kind": "reindex"}), 201)
    assert job["tenant_id"] == str(tenant)
    job = data(acme_client.post("/v1/functions/jobs",
                                json={"kind": "reindex", "tenantId": str(tenant)}), 201)
    assert job["tenant_id"] == str(tenant)
    err = error(acme_client.post("/v1/functions/jobs",
                                 json={"kind": "reindex", "tenantId": str(other_tenant)}), 400)
    assert err["field"] == "tenantId"
    with engine.connect() as conn:
        creators = conn.execute(text("SELECT DISTINCT created_by, tenant_id FROM mdm.aa_job")).all()
    assert creators == [("api:key:acme-app", tenant)]


def test_tenant_key_admin_actions_are_audited_with_its_name(acme_client, engine, tenant):
    with engine.begin() as conn:
        job_id = insert_job(conn, tenant_id=tenant, status="dlq", attempts=8,
                            completed_at=datetime.now(UTC))
    data(acme_client.post(f"/v1/functions/jobs/{job_id}/retry"))
    with engine.connect() as conn:
        assert audit_rows(conn, job_id)[0]["actor"] == "api:key:acme-app"


def test_a_tenant_key_sees_and_changes_only_its_cron_entries(api, acme_client, tenant,
                                                             other_tenant):
    body = {"schedule": "0 * * * *", "kind": "reindex"}
    data(api.post("/v1/functions/cron", json={**body, "name": "theirs",
                                              "tenantId": str(other_tenant)}), 201)
    mine = data(acme_client.post("/v1/functions/cron", json={**body, "name": "mine"}), 201)
    assert mine["tenant_id"] == str(tenant)
    assert [e["name"] for e in data(acme_client.get("/v1/functions/cron"))] == ["mine"]
    error(acme_client.delete("/v1/functions/cron/theirs"), 404)
    error(acme_client.post("/v1/functions/cron", json={**body, "name": "sneaky",
                                                        "tenantId": str(other_tenant)}), 400)
    data(acme_client.delete("/v1/functions/cron/mine"))
    assert "theirs" in [e["name"] for e in data(api.get("/v1/functions/cron"))]


def test_metrics_need_the_service_role_key(acme_client, anonymous):
    """A tenant key is right, only not enough: 403, not the 401 (with WWW-Authenticate) that
    told its client to check or replace a key that works."""
    response = acme_client.get("/metrics")
    err = error(response, 403)
    assert err["code"] == "service_role_required" and "service-role key" in err["message"]
    assert "www-authenticate" not in response.headers
    error(anonymous.get("/metrics"), 401)


def test_a_revoked_key_stops_working_at_once(acme_client, engine, tenant):
    data(acme_client.get("/v1/functions/jobs"))
    with engine.begin() as conn:
        api_key_revoke(conn, "acme-app", actor="test:ops")
    assert error(acme_client.get("/v1/functions/jobs"), 401)["message"] == "invalid API key"


def test_a_key_of_another_tenant_is_another_scope(api_url, engine, tenant, other_tenant):
    with engine.begin() as conn:
        acme_job = insert_job(conn, tenant_id=tenant)
    key = tenant_key(engine, "globex-app", other_tenant)
    with httpx.Client(base_url=api_url, headers={"authorization": f"Bearer {key}"}) as globex:
        error(globex.get(f"/v1/functions/jobs/{acme_job}"), 404)
        assert data(globex.get("/v1/functions/jobs")) == []
