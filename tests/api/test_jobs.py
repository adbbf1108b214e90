"""Jobs over HTTP: enqueue with the seed's camelCase body, read one, list by status."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest
from sqlalchemy import text

from postrelay.queue.schema import SYSTEM_TENANT_ID
from tests.api.conftest import data, error
from tests.factories import insert_job, job_row

JOB_FIELDS = {"id", "kind", "tenant_id", "priority", "payload", "status", "attempts",
              "max_attempts", "error", "scheduled_at", "started_at", "completed_at",
              "created_at", "idempotency_key"}


def test_enqueue_with_the_seeds_body_and_read_it_back(api, engine, tenant):
    before = datetime.now().astimezone()
    job = data(api.post("/v1/functions/jobs", json={
        "kind": "reindex", "payload": {"month": "2026-10"}, "delaySecs": 60, "maxAttempts": 3,
        "priority": 5, "idempotencyKey": "report-2026-10", "tenantId": str(tenant),
    }), 201)
    assert set(job) == JOB_FIELDS
    assert job["kind"] == "reindex" and job["tenant_id"] == str(tenant)
    assert job["payload"] == {"month": "2026-10"} and job["priority"] == 5
    assert (job["status"], job["attempts"], job["max_attempts"]) == ("pending", 0, 3)
    assert job["error"] is None and job["started_at"] is None and job["completed_at"] is None
    assert job["idempotency_key"] == "report-2026-10"
    scheduled = datetime.fromisoformat(job["scheduled_at"])
    assert before + timedelta(seconds=55) < scheduled < before + timedelta(seconds=70)
    assert data(api.get(f"/v1/functions/jobs/{job['id']}")) == job
    with engine.connect() as conn:
        row = job_row(conn, uuid.UUID(job["id"]))
    assert row["created_by"] == "api:service-role" and row["available_at"] == scheduled


def test_enqueue_defaults(api, engine, tenant):
    job = data(api.post("/v1/functions/jobs", json={"kind": "reindex", "tenantId": str(tenant)}),
               201)
    assert job["payload"] == {} and job["priority"] == 100
    assert job["max_attempts"] == 8  # POSTRELAY_JOB_MAX_RETRIES' default
    # The service-role key without a tenant enqueues for the system tenant.
    job = data(api.post("/v1/functions/jobs", json={"kind": "reindex"}), 201)
    assert job["tenant_id"] == str(SYSTEM_TENANT_ID)


def test_the_same_idempotency_key_returns_the_first_job(api, engine, tenant):
    body = {"kind": "reindex", "tenantId": str(tenant), "idempotencyKey": "k1", "payload": {"n": 1}}
    first = data(api.post("/v1/functions/jobs", json=body), 201)
    again = data(api.post("/v1/functions/jobs", json={**body, "payload": {"n": 2}}), 201)
    assert again == first
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job")).scalar_one() == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "no_such_kind"}, "kind"),
        ({"kind": "reindex", "payload": [1, 2]}, "payload"),
        ({"kind": "reindex", "payload": "text"}, "payload"),
        ({"kind": "reindex", "payload": {"a": "nul\u0000"}}, "payload"),
        ({"kind": "reindex", "delaySecs": -1}, "delaySecs"),
        ({"kind": "reindex", "maxAttempts": 0}, "maxAttempts"),
        ({"kind": "reindex", "priority": 40000}, "priority"),
        ({"kind": "reindex", "idempotencyKey": ""}, "idempotencyKey"),
        ({"kind": "reindex", "idempotencyKey": "outbox:e:r"}, "idempotencyKey"),
        ({"kind": "reindex", "tenantId": "acme"}, "tenantId"),
        ({"kind": "reindex", "tenantId": "00000000-0000-0000-0000-00000000beef"}, "tenantId"),
        ({"kind": "reindex", "delay_secs": 5}, "delay_secs"),
        ({"payload": {}}, "kind"),
    ],
)
def test_bad_enqueue_is_400_naming_the_field(api, engine, tenant, body, field):
    err = error(api.post("/v1/functions/jobs", json=body), 400)
    assert err["code"] == "invalid_request" and err["field"] == field
    assert err["message"].startswith(f"{field}: ")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job")).scalar_one() == 0


def test_malformed_json_is_400(api, tenant):
    response = api.post("/v1/functions/jobs", content=b"{not json",
                        headers={"content-type": "application/json"})
    assert error(response, 400)["field"] == "body"
    assert error(api.post("/v1/functions/jobs"), 400)["field"] == "body"


def test_get_unknown_or_malformed_id(api, tenant):
    missing = uuid.uuid4()
    err = error(api.get(f"/v1/functions/jobs/{missing}"), 404)
    assert err["code"] == "not_found" and str(missing) in err["message"]
    err = error(api.get("/v1/functions/jobs/not-a-uuid"), 400)
    assert err["field"] == "id"


def test_list_by_status_newest_first_with_limit(api, engine, tenant):
    with engine.begin() as conn:
        old = insert_job(conn, tenant_id=tenant)
    with engine.begin() as conn:
        dead = insert_job(conn, tenant_id=tenant, status="dlq", attempts=8)
    with engine.begin() as conn:
        new = insert_job(conn, tenant_id=tenant)
    ids = [j["id"] for j in data(api.get("/v1/functions/jobs"))]
    assert ids == [str(new), str(dead), str(old)]
    pending = data(api.get("/v1/functions/jobs", params={"status": "pending"}))
    assert [j["id"] for j in pending] == [str(new), str(old)]
    assert [j["id"] for j in data(api.get("/v1/functions/jobs", params={"limit": 1}))] == [str(new)]
    assert len(data(api.get("/v1/functions/jobs", params={"limit": 500}))) == 3


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 501}, {"limit": -1},
                                    {"limit": "ten"}, {"status": "dead"}, {"status": "DLQ"}])
def test_list_refuses_bad_filters_with_400(api, tenant, params):
    err = error(api.get("/v1/functions/jobs", params=params), 400)
    (field,) = params
    assert err["field"] == field and err["message"].startswith(f"{field}: ")


def test_list_default_limit_is_50(api, engine, tenant):
    with engine.begin() as conn:
        for _ in range(55):
            insert_job(conn, tenant_id=tenant)
    assert len(data(api.get("/v1/functions/jobs"))) == 50


def test_unknown_route_and_method_use_the_error_envelope(api, tenant):
    assert error(api.get("/v1/functions/nope"), 404)["code"] == "not_found"
    assert error(api.put("/v1/functions/jobs"), 405)["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("raw", "field"),
    [(b'{"kind":"reindex","delaySecs":NaN}', "delaySecs"),
     (b'{"kind":"reindex","delaySecs":Infinity}', "delaySecs"),
     (b'{"kind":"reindex","delaySecs":1e12}', "delaySecs"),
     (b'{"kind":"reindex","priority":true}', "priority"),
     (b'{"kind":"reindex","priority":"5"}', "priority"),
     (b'{"kind":"reindex","maxAttempts":1.5}', "maxAttempts"),
     (b'{"kind":"reindex","payload":{"a":NaN}}', "payload"),
     (b'[1, 2]', "body")],
)
def test_json_edge_cases_are_400_not_500(api, tenant, raw, field):
    response = api.post("/v1/functions/jobs", content=raw,
                        headers={"content-type": "application/json"})
    assert error(response, 400)["field"] == field


def test_a_job_parked_at_infinity_reads_as_the_latest_time(api, engine, tenant):
    """SQL written by hand parks a job at available_at 'infinity': its answer was a 500."""
    with engine.begin() as conn:
        job_id = insert_job(conn, tenant_id=tenant)
        conn.execute(text("UPDATE mdm.aa_job SET available_at = 'infinity' WHERE id = :id"),
                     {"id": job_id})
    job = data(api.get(f"/v1/functions/jobs/{job_id}"))
    assert job["scheduled_at"].startswith("9999-12-31T23:59:59")
