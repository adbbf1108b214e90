"""Cancelling jobs over HTTP: one by id, many by filter, and the email log told."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from sqlalchemy import text

from tests.api.conftest import data, error
from tests.factories import audit_rows, insert_job, job_row


def insert(engine, tenant_id, **fields) -> uuid.UUID:
    with engine.begin() as conn:
        return insert_job(conn, tenant_id=tenant_id, **fields)


def test_cancel_one_fails_it_then_a_second_cancel_is_409(api, engine, tenant):
    job = insert(engine, tenant)
    assert data(api.post(f"/v1/functions/jobs/{job}/cancel")) == {"id": str(job),
                                                                  "was": "pending"}
    with engine.connect() as conn:
        assert job_row(conn, job)["state"] == "failed"
        (audit,) = audit_rows(conn, job)
    assert (audit["action"], audit["actor"]) == ("job_cancelled", "api:service-role")
    assert "is failed" in error(api.post(f"/v1/functions/jobs/{job}/cancel"), 409)["message"]
    error(api.post(f"/v1/functions/jobs/{uuid.uuid4()}/cancel"), 404)


def test_a_tenant_key_cancels_only_its_own_jobs(acme_client, engine, tenant, other_tenant):
    mine = insert(engine, tenant)
    theirs = insert(engine, other_tenant)
    error(acme_client.post(f"/v1/functions/jobs/{theirs}/cancel"), 404)
    assert data(acme_client.post("/v1/functions/jobs/cancel",
                                 json={"kind": "reindex"})) == {"cancelled": 1}
    with engine.connect() as conn:
        assert job_row(conn, mine)["state"] == "failed"
        assert job_row(conn, theirs)["state"] == "pending"
    answer = error(acme_client.post("/v1/functions/jobs/cancel",
                                    json={"tenantId": str(other_tenant)}), 400)
    assert answer["field"] == "tenantId"


def test_bulk_cancel_of_pending_emails_logs_them_cancelled(api, engine, tenant):
    payload = {"template": "welcome", "to": ["Ann@Example.com"], "from": "shop@example.com"}
    job = insert(engine, tenant, kind="email_send", payload=payload)
    insert(engine, tenant, kind="email_send", payload={**payload, "template": "invoice"})
    answer = api.post("/v1/functions/jobs/cancel", json={"template": "welcome"})
    assert answer.json() == {"data": {"cancelled": 1}, "meta": None}
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT job_id, status, template, recipients, error FROM mdm.aa_email_log")).all()
    assert len(rows) == 1
    assert rows[0][:4] == (job, "cancelled", "welcome", ["ann@example.com"])
    assert rows[0].error.startswith("cancelled by api:service-role at ")


def test_bulk_cancel_bad_input_names_the_field_and_writes_nothing(api, engine, tenant):
    job = insert(engine, tenant, status="pending", completed_at=None)
    for body, field in (({"kind": "nope"}, "kind"), ({}, "filter"),
                        ({"tenantId": str(uuid.uuid4())}, "tenantId"),
                        ({"kind": "reindex", "limit": 1001}, "limit"),
                        ({"kind": "reindex", "limit": True}, "limit"),
                        ({"kind": "reindex", "limit": "5"}, "limit"),
                        ({"kind": "reindex", "createdFrom": datetime.now(UTC).isoformat(),
                          "createdTo": "2000-01-01T00:00:00Z"}, "createdTo")):
        assert field in error(api.post("/v1/functions/jobs/cancel", json=body), 400)["field"]
    with engine.connect() as conn:
        assert job_row(conn, job)["state"] == "pending"


def test_a_template_no_text_column_can_hold_is_400_naming_it(api, engine, tenant):
    job = insert(engine, tenant, kind="email_send", payload={"template": "welcome"})
    for template, rule in (("\ud800", "unpaired surrogate"), ("wel\x00come", "NUL")):
        # By hand: a lone surrogate has no UTF-8 form, so only its JSON escape can carry it.
        body = json.dumps({"template": template})
        answer = error(api.post("/v1/functions/jobs/cancel", content=body,
                                headers={"content-type": "application/json"}), 400)
        assert answer["field"] == "template" and rule in answer["message"], answer
    with engine.connect() as conn:
        assert job_row(conn, job)["state"] == "pending"


def test_a_rule_names_the_other_fields_as_the_body_spells_them(api, engine, tenant):
    """"give at least one of kind, tenant_id, created_from, ..." named fields that a body
    sending them would have had refused as unknown."""
    err = error(api.post("/v1/functions/jobs/cancel", json={}), 400)
    assert err["message"] == ("filter: give at least one of kind, tenantId, createdFrom, "
                              "createdTo, eventId, template")
    err = error(api.post("/v1/functions/jobs/cancel", json={
        "kind": "reindex", "createdFrom": datetime.now(UTC).isoformat(),
        "createdTo": "2000-01-01T00:00:00Z"}), 400)
    assert err["message"] == "createdTo: must be later than createdFrom"
    err = error(api.post("/v1/functions/pauses", json={}), 400)
    assert err["message"] == "scope: give a kind, a tenantId, or both; or `all` for every job"


def test_a_number_is_not_a_time(api, engine, tenant):
    """pydantic read a number as seconds since 1970: `createdTo: 0` cancelled every job made
    before 1970, and a large one every job there is."""
    with engine.begin() as conn:
        job = insert_job(conn, tenant_id=tenant)
    for body in ({"kind": "reindex", "createdTo": 99999999999},
                 {"kind": "reindex", "createdFrom": 0}):
        err = error(api.post("/v1/functions/jobs/cancel", json=body), 400)
        assert err["field"] == next(iter(set(body) - {"kind"}))
        assert "ISO 8601 text" in err["message"]
    with engine.begin() as conn:
        assert job_row(conn, job)["state"] == "pending"
