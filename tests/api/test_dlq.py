"""The dead-letter queue over HTTP, with the seed's paths and answers."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from tests.api.conftest import data, error
from tests.factories import audit_rows, insert_job, job_row


def dead(engine, tenant_id, *, died_ago: float = 60.0, **fields) -> uuid.UUID:
    fields = {"attempts": 3, "max_attempts": 3, "last_error": "Fonction 'ghost' introuvable",
              **fields}
    with engine.begin() as conn:
        return insert_job(conn, tenant_id=tenant_id, status="dlq",
                          completed_at=datetime.now(UTC) - timedelta(seconds=died_ago), **fields)


def test_list_dlq_is_not_read_as_a_job_id(api, engine, tenant):
    older = dead(engine, tenant, died_ago=600)
    newer = dead(engine, tenant, died_ago=60)
    with engine.begin() as conn:
        insert_job(conn, tenant_id=tenant)
    jobs = data(api.get("/v1/functions/jobs/dlq"))
    assert [j["id"] for j in jobs] == [str(newer), str(older)]
    assert all(j["status"] == "dlq" and j["error"] == "Fonction 'ghost' introuvable"
               for j in jobs)
    assert jobs[0]["attempts"] == jobs[0]["max_attempts"] == 3
    assert [j["id"] for j in data(api.get("/v1/functions/jobs/dlq", params={"limit": 1}))] == [
        str(newer)]
    assert error(api.get("/v1/functions/jobs/dlq", params={"limit": 0}), 400)["field"] == "limit"


def test_retry_keeps_attempts_and_audits_the_key(api, engine, tenant):
    job_id = dead(engine, tenant)
    job = data(api.post(f"/v1/functions/jobs/{job_id}/retry"))
    assert job["id"] == str(job_id) and job["status"] == "pending"
    assert (job["attempts"], job["max_attempts"]) == (3, 3)  # exactly one more attempt
    assert job["completed_at"] is None and job["error"] == "Fonction 'ghost' introuvable"
    with engine.connect() as conn:
        assert job_row(conn, job_id)["attempts"] == 3
        (audit,) = audit_rows(conn, job_id)
    assert audit["action"] == "job_retry" and audit["actor"] == "api:service-role"


def test_retry_of_a_job_not_in_the_dlq_is_404(api, engine, tenant):
    with engine.begin() as conn:
        live = insert_job(conn, tenant_id=tenant, status="running")
    err = error(api.post(f"/v1/functions/jobs/{live}/retry"), 404)
    assert "not in the DLQ" in err["message"]
    error(api.post(f"/v1/functions/jobs/{uuid.uuid4()}/retry"), 404)
    assert error(api.post("/v1/functions/jobs/x/retry"), 400)["field"] == "id"


def test_requeue_answers_the_count_in_the_seeds_shape(api, engine, tenant):
    first = dead(engine, tenant, died_ago=100)
    dead(engine, tenant, died_ago=50)
    response = api.post("/v1/functions/jobs/dlq/requeue")
    assert response.status_code == 200
    assert response.json() == {"data": {"requeued": 2}, "meta": None}
    assert api.post("/v1/functions/jobs/dlq/requeue").json() == {"data": {"requeued": 0},
                                                                 "meta": None}
    with engine.connect() as conn:
        row = job_row(conn, first)
        (audit,) = audit_rows(conn, first)
    assert row["state"] == "pending" and row["attempts"] == 3
    assert audit["action"] == "job_requeue" and audit["actor"] == "api:service-role"


def test_requeue_takes_at_most_1000_per_call(api, engine, tenant):
    with engine.begin() as conn:
        for _ in range(1003):
            insert_job(conn, tenant_id=tenant, status="dlq", attempts=8,
                       completed_at=datetime.now(UTC))
    assert data(api.post("/v1/functions/jobs/dlq/requeue"))["requeued"] == 1000
    assert data(api.post("/v1/functions/jobs/dlq/requeue"))["requeued"] == 3


@pytest.mark.parametrize("limit", [0, 1001])
def test_requeue_limit_outside_1_to_1000_is_400(api, engine, tenant, limit):
    dead(engine, tenant)
    err = error(api.post("/v1/functions/jobs/dlq/requeue", params={"limit": limit}), 400)
    assert err["field"] == "limit"
    assert data(api.post("/v1/functions/jobs/dlq/requeue", params={"limit": 1}))["requeued"] == 1


def test_discard_deletes_a_dead_job_and_audits(api, engine, tenant):
    job_id = dead(engine, tenant)
    assert data(api.delete(f"/v1/functions/jobs/{job_id}")) == {"id": str(job_id),
                                                               "discarded": True}
    error(api.get(f"/v1/functions/jobs/{job_id}"), 404)
    with engine.connect() as conn:
        (audit,) = audit_rows(conn, job_id)
    assert audit["action"] == "job_discard" and audit["actor"] == "api:service-role"
    error(api.delete(f"/v1/functions/jobs/{job_id}"), 404)


def test_discard_refuses_a_live_job(api, engine, tenant):
    with engine.begin() as conn:
        live = insert_job(conn, tenant_id=tenant)
    assert "not in the DLQ" in error(api.delete(f"/v1/functions/jobs/{live}"), 404)["message"]
    assert data(api.get(f"/v1/functions/jobs/{live}"))["status"] == "pending"


def test_a_dead_job_whose_payload_holds_a_very_long_integer_is_listed(api, engine, tenant):
    """SQL written by hand can store an integer of more digits than Python converts; the
    DLQ then answered 500 for every job in it. The integer shows as its digits."""
    job_id = dead(engine, tenant)
    digits = "7" * 5000
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_job SET payload = CAST(:p AS jsonb) WHERE id = :id"),
                     {"p": f'{{"n": {digits}}}', "id": job_id})
    [job] = data(api.get("/v1/functions/jobs/dlq"))
    assert job["id"] == str(job_id) and job["payload"] == {"n": digits}
    assert data(api.get(f"/v1/functions/jobs/{job_id}"))["payload"] == {"n": digits}
