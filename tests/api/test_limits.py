"""Limits over HTTP: the service role limits any scope, a tenant key only its own tenant."""

from __future__ import annotations

from sqlalchemy import text

from tests.api.conftest import data, error
from tests.factories import insert_throttle


def test_set_list_and_remove(api, engine, tenant):
    made = data(api.post("/v1/functions/limits", json={
        "kind": "email_send", "rate": "14/s", "concurrency": 20, "key": "domain"}))
    assert (made["kind"], made["tenantId"], made["ratePerSec"], made["burst"],
            made["concurrency"], made["key"], made["createdBy"]) == (
        "email_send", None, 14.0, 14, 20, "domain", "api:service-role")
    data(api.post("/v1/functions/limits", json={"kind": "email_send", "tenantId": str(tenant),
                                                "rate": 5, "burst": 2}))
    listed = data(api.get("/v1/functions/limits"))
    assert [(lim["kind"], lim["tenantId"]) for lim in listed] == [("email_send", None),
                                                                  ("email_send", str(tenant))]
    data(api.post("/v1/functions/limits/remove", json={"kind": "email_send"}))
    error(api.post("/v1/functions/limits/remove", json={"kind": "email_send"}), 404)
    assert len(data(api.get("/v1/functions/limits"))) == 1


def test_bad_input_names_the_field_and_writes_nothing(api, engine, tenant):
    for body, field in (({"kind": "nope", "rate": "1/s"}, "kind"),
                        ({"kind": "reindex", "rate": "0/s"}, "rate"),
                        ({"kind": "reindex", "rate": -2}, "rate"),
                        ({"kind": "reindex", "rate": "quick"}, "rate"),
                        ({"kind": "reindex"}, "rate"),
                        ({"kind": "reindex", "concurrency": 0}, "concurrency"),
                        # JSON true is not the number 1, nor "5" the number 5.
                        ({"kind": "reindex", "rate": True}, "rate"),
                        ({"kind": "reindex", "concurrency": True}, "concurrency"),
                        ({"kind": "reindex", "concurrency": "5"}, "concurrency"),
                        ({"kind": "reindex", "rate": "1/s", "burst": True}, "burst"),
                        ({"kind": "reindex", "concurrency": 1, "key": "$.x"}, "key"),
                        ({"kind": "reindex", "rate": "1/s",
                          "tenantId": "00000000-0000-0000-0000-0000000000ff"}, "tenantId")):
        assert error(api.post("/v1/functions/limits", json=body), 400)["field"] == field, body
    said = error(api.post("/v1/functions/limits", json={"kind": "reindex", "rate": True}), 400)
    assert said["message"] == ("rate: must be a rate such as 14/s or 1000/min, or a number "
                               "per second")  # not pydantic's "Value error, must be ..."
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job_limit")).scalar_one() == 0


def test_a_tenant_key_limits_and_sees_its_own_tenant_only(api, acme_client, engine, tenant,
                                                          other_tenant):
    data(api.post("/v1/functions/limits", json={"kind": "reindex", "concurrency": 1,
                                                "tenantId": str(other_tenant)}))
    data(api.post("/v1/functions/limits", json={"kind": "email_send", "rate": "1/s"}))
    mine = data(acme_client.post("/v1/functions/limits", json={"kind": "reindex",
                                                               "concurrency": 4}))
    assert mine["tenantId"] == str(tenant)
    refused = error(acme_client.post("/v1/functions/limits", json={
        "kind": "reindex", "concurrency": 1, "tenantId": str(other_tenant)}), 400)
    assert refused["field"] == "tenantId"
    # A tenant key removes its own limit, never the kind-wide one or another tenant's.
    error(acme_client.post("/v1/functions/limits/remove", json={"kind": "email_send"}), 404)
    seen = {(lim["kind"], lim["tenantId"]) for lim in data(acme_client.get(
        "/v1/functions/limits"))}
    assert seen == {("email_send", None), ("reindex", str(tenant))}


def test_the_listing_shows_throttled_destinations_in_meta(api, engine, tenant):
    with engine.begin() as conn:
        insert_throttle(conn, reason="SMTP localhost:25 said mail: 454 4.7.0 slow down")
        insert_throttle(conn, kind="outbox_dispatch", key_path=["endpoint_id"], key="ep-1",
                        tenant_id=tenant, reason="HTTP 429, Retry-After 2 s", ceiling=None,
                        paused_secs=0, rate=1.0)
    answer = api.get("/v1/functions/limits")
    assert answer.status_code == 200 and answer.json()["data"] == []
    smtp, hook = answer.json()["meta"]["throttled"]
    assert (smtp["kind"], smtp["key"], smtp["ratePerSec"], smtp["recoversTo"]) == (
        "email_send", None, 0.0, 14.0)  # paused
    assert "454 4.7.0" in smtp["reason"] and smtp["since"] < smtp["pausedUntil"] < smtp["until"]
    assert (hook["key"], hook["value"], hook["tenantId"], hook["recoversTo"]) == (
        "endpoint_id", "ep-1", str(tenant), None)
    assert hook["ratePerSec"] >= 1.0 and hook["reason"] == "HTTP 429, Retry-After 2 s"


def test_a_tenant_key_changes_no_limit_the_operator_set(api, acme_client, engine, tenant):
    """A tenant's own limit governs its jobs instead of the kind-wide one: its key could lift
    its mail out of the SMTP server's shared rate, or undo the cap the operator put on it."""
    data(api.post("/v1/functions/limits", json={"kind": "email_send", "rate": "14/s"}))
    data(api.post("/v1/functions/limits", json={"kind": "reindex", "concurrency": 1,
                                                "tenantId": str(tenant)}))
    escape = error(acme_client.post("/v1/functions/limits", json={
        "kind": "email_send", "rate": "1000000/s"}), 403)
    assert escape["code"] == "kind_wide_limit"
    for path, body in (("", {"kind": "reindex", "concurrency": 100}),
                       ("/remove", {"kind": "reindex"})):
        undone = error(acme_client.post(f"/v1/functions/limits{path}", json=body), 403)
        assert undone["code"] == "operator_limit" and "api:service-role" in undone["message"]
    # Its own limit on a kind nobody else limits is its to set, replace and remove.
    data(acme_client.post("/v1/functions/limits", json={"kind": "virus_scan", "rate": "2/s"}))
    data(acme_client.post("/v1/functions/limits", json={"kind": "virus_scan", "rate": "4/s"}))
    data(acme_client.post("/v1/functions/limits/remove", json={"kind": "virus_scan"}))
    with engine.connect() as conn:
        kept = conn.execute(text(
            "SELECT job_kind::text, tenant_id IS NULL, rate_per_sec, concurrency "
            "FROM mdm.aa_job_limit ORDER BY 1")).all()
    assert [tuple(row) for row in kept] == [("email_send", True, 14.0, None),
                                            ("reindex", False, None, 1)]


def test_a_kind_wide_limit_set_later_removes_the_one_a_tenant_key_set(api, acme_client,
                                                                      engine, tenant):
    """The other order: a tenant key limited its mail first, then the operator capped the
    kind for everyone. The tenant's own limit would still govern its jobs instead."""
    data(acme_client.post("/v1/functions/limits", json={"kind": "email_send",
                                                        "rate": "1000000/s"}))
    data(api.post("/v1/functions/limits", json={"kind": "email_send", "rate": "14/s"}))
    listed = data(acme_client.get("/v1/functions/limits"))
    assert [(lim["kind"], lim["tenantId"], lim["ratePerSec"]) for lim in listed] == [
        ("email_send", None, 14.0)]
    again = error(acme_client.post("/v1/functions/limits", json={
        "kind": "email_send", "rate": "1000000/s"}), 403)
    assert again["code"] == "kind_wide_limit"


def test_a_rate_too_slow_for_the_claims_arithmetic_is_refused(api, acme_client, engine):
    """A tenant key's limit of 5e-324/s on its own jobs made the refill (rate x seconds
    idle) underflow in PostgreSQL, which raises: every other limited claim failed, of
    every limited kind and tenant."""
    for rate in (5e-324, 1e-101, "0." + "0" * 110 + "1/s"):
        said = error(acme_client.post("/v1/functions/limits",
                                      json={"kind": "reindex", "rate": rate}), 400)
        assert said["field"] == "rate" and "at least 1e-100/s" in said["message"], rate
    huge = error(api.post("/v1/functions/limits", content=b'{"kind": "reindex", "rate": 1e400}',
                          headers={"content-type": "application/json"}), 400)
    assert huge["message"] == "rate: must be at most 1,000,000/s"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job_limit")).scalar_one() == 0
