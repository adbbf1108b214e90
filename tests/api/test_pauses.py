"""Pauses over HTTP: the service role pauses any scope, a tenant key only its own."""

from __future__ import annotations

from sqlalchemy import text

from tests.api.conftest import data, error


def test_pause_list_and_resume(api, engine, tenant):
    made = api.post("/v1/functions/pauses", json={"kind": "email_send", "tenantId": str(tenant)})
    body = data(made, 201)
    assert (body["kind"], body["tenantId"], body["pausedBy"]) == (
        "email_send", str(tenant), "api:service-role")
    again = data(api.post("/v1/functions/pauses",
                          json={"kind": "email_send", "tenantId": str(tenant)}), 200)
    assert again["pausedAt"] == body["pausedAt"]
    data(api.post("/v1/functions/pauses", json={"all": True}), 201)
    listed = data(api.get("/v1/functions/pauses"))
    assert [(p["kind"], p["tenantId"]) for p in listed] == [("email_send", str(tenant)),
                                                            (None, None)]
    data(api.post("/v1/functions/pauses/resume", json={"all": True}))
    error(api.post("/v1/functions/pauses/resume", json={"all": True}), 404)
    assert len(data(api.get("/v1/functions/pauses"))) == 1


def test_bad_input_names_the_field_and_writes_nothing(api, engine, tenant):
    for body, field in (({"kind": "nope"}, "kind"), ({}, "scope"),
                        ({"all": True, "kind": "reindex"}, "all"),
                        ({"all": 1}, "all"), ({"all": "true"}, "all"),
                        ({"tenantId": "not-a-uuid"}, "tenantId"),
                        ({"tenantId": "00000000-0000-0000-0000-0000000000ff"}, "tenantId")):
        assert error(api.post("/v1/functions/pauses", json=body), 400)["field"] == field, body
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job_pause")).scalar_one() == 0


def test_a_tenant_key_pauses_and_sees_its_own_tenant_only(api, acme_client, engine, tenant,
                                                          other_tenant):
    data(api.post("/v1/functions/pauses", json={"tenantId": str(other_tenant)}), 201)
    data(api.post("/v1/functions/pauses", json={"kind": "reindex"}), 201)
    mine = data(acme_client.post("/v1/functions/pauses", json={"kind": "email_send"}), 201)
    assert mine["tenantId"] == str(tenant)
    refused = error(acme_client.post("/v1/functions/pauses", json={"all": True}), 400)
    assert refused["field"] == "all"
    assert error(acme_client.post("/v1/functions/pauses/resume",
                                  json={"tenantId": str(other_tenant)}), 400)["field"] == "tenantId"
    seen = {(p["kind"], p["tenantId"]) for p in data(acme_client.get("/v1/functions/pauses"))}
    assert seen == {("reindex", None), ("email_send", str(tenant))}


def test_a_tenant_key_lifts_its_own_pauses_but_never_the_operators(api, acme_client, tenant):
    """Pausing a tenant is how an operator stops one that floods a shared destination: its
    key resumed the pause at once until this was refused."""
    stopped = {"kind": "email_send", "tenantId": str(tenant)}
    data(api.post("/v1/functions/pauses", json=stopped), 201)
    refused = error(acme_client.post("/v1/functions/pauses/resume",
                                     json={"kind": "email_send"}), 403)
    assert refused["code"] == "operator_pause" and "api:service-role" in refused["message"]
    still = data(acme_client.get("/v1/functions/pauses"))
    assert [(p["kind"], p["pausedBy"]) for p in still] == [("email_send", "api:service-role")]
    data(acme_client.post("/v1/functions/pauses", json={"kind": "reindex"}), 201)
    lifted = data(acme_client.post("/v1/functions/pauses/resume", json={"kind": "reindex"}))
    assert lifted["pausedBy"].startswith("api:key:")
    data(api.post("/v1/functions/pauses/resume", json=stopped))  # the operator lifts its own


def test_an_operator_pause_over_a_tenant_keys_own_is_the_operators(api, acme_client, tenant):
    """The operator pausing a scope the tenant's key had paused already got 200 "paused",
    and the key then lifted it: the tenant ran on while the operator believed it stopped."""
    scope = {"kind": "email_send", "tenantId": str(tenant)}
    data(acme_client.post("/v1/functions/pauses", json={"kind": "email_send"}), 201)
    held = data(api.post("/v1/functions/pauses", json=scope), 200)
    assert held["pausedBy"] == "api:service-role"
    refused = error(acme_client.post("/v1/functions/pauses/resume",
                                     json={"kind": "email_send"}), 403)
    assert refused["code"] == "operator_pause"
    still = data(api.get("/v1/functions/pauses"))
    assert [(p["kind"], p["pausedBy"]) for p in still] == [("email_send", "api:service-role")]
