"""Webhook endpoints over HTTP: add, list, read, disable, enable, delete and the delivery
attempts; tenant keys held to their own tenant's endpoints (another tenant's is a 404 like a
missing one), the signing secret answered by the add alone, a private CA never answered,
and bad input refused naming the field with nothing written."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import trustme
from sqlalchemy import text

from tests.api.conftest import SERVICE_KEY, data, error, tenant_key
from tests.api.server import UNTHROTTLED, serve_database
from tests.factories import insert_attempt
from tests.webhooks.test_private_ca_input import dated_ca

HOOKS = "/v1/functions/webhooks"
URL = "https://hooks.acme.example/in"
ENDPOINT_FIELDS = {"id", "tenant_id", "url", "event_types", "enabled", "disabled_reason",
                   "disabled_by", "private_ca", "created_at", "updated_at"}
ATTEMPT_FIELDS = {"id", "job_id", "endpoint_id", "event_id", "attempt", "status_code",
                  "duration_ms", "response_body", "error", "created_at"}


def add(client: httpx.Client, **body: object) -> dict:
    return data(client.post(HOOKS, json={"url": URL, **body}), 201)  # type: ignore[no-any-return]


def stored(engine) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT id, tenant_id, url, enabled, disabled_reason, ca_pem IS NOT NULL, secret "
            "FROM mdm.aa_webhook_endpoint ORDER BY created_at, id"))]


def test_add_list_get_disable_enable_delete(acme_client, engine, tenant):
    answer = acme_client.post(HOOKS, json={"url": "HTTPS://Hooks.Acme.Example:443/in",
                                           "eventTypes": ["order.*", "user.created"]})
    added = data(answer, 201)
    assert answer.headers["cache-control"] == "no-store"
    assert set(added) == {"endpoint", "secret"} and added["secret"].startswith("whsec_")
    endpoint = added["endpoint"]
    assert set(endpoint) == ENDPOINT_FIELDS
    assert (endpoint["url"], endpoint["tenant_id"]) == (URL, str(tenant))  # normalised
    assert endpoint["event_types"] == ["order.*", "user.created"]
    assert (endpoint["enabled"], endpoint["disabled_reason"], endpoint["private_ca"]) == (
        True, None, False)
    assert stored(engine)[0][-1] == added["secret"]  # the secret deliveries sign with

    assert data(acme_client.get(HOOKS)) == [endpoint]
    one = f"{HOOKS}/{endpoint['id']}"
    assert data(acme_client.get(one)) == endpoint
    disabled = data(acme_client.post(f"{one}/disable"))
    assert (disabled["enabled"], disabled["disabled_reason"]) == (
        False, "disabled by api:key:acme-app")
    enabled = data(acme_client.post(f"{one}/enable"))
    assert (enabled["enabled"], enabled["disabled_reason"]) == (True, None)
    assert data(acme_client.delete(one)) == {"id": endpoint["id"], "deleted": True}
    assert stored(engine) == []
    for gone in (acme_client.get(one), acme_client.delete(one),
                 acme_client.post(f"{one}/enable"), acme_client.get(f"{one}/attempts")):
        assert error(gone, 404)["message"] == f"no webhook endpoint with id {endpoint['id']}"
    assert data(acme_client.get(HOOKS)) == []


def test_no_event_types_means_every_type(acme_client):
    assert add(acme_client)["endpoint"]["event_types"] is None
    assert add(acme_client, eventTypes=[])["endpoint"]["event_types"] is None


def test_attempts_newest_first_within_the_limit(acme_client, engine):
    endpoint = add(acme_client)["endpoint"]
    with engine.begin() as conn:
        first = insert_attempt(conn, endpoint["id"], status_code=None, response_body=None,
                               error="ConnectError: refused", ago_secs=60)
        insert_attempt(conn, endpoint["id"], event_id=first, attempt=2, status_code=503,
                       response_body="busy", ago_secs=30)
        insert_attempt(conn, endpoint["id"], event_id=first, attempt=3, ago_secs=1)
    path = f"{HOOKS}/{endpoint['id']}/attempts"
    attempts = data(acme_client.get(path))
    assert [a["attempt"] for a in attempts] == [3, 2, 1]
    assert set(attempts[0]) == ATTEMPT_FIELDS
    assert (attempts[0]["status_code"], attempts[0]["response_body"]) == (200, "ok")
    assert (attempts[2]["status_code"], attempts[2]["error"]) == (
        None, "ConnectError: refused")
    assert {a["event_id"] for a in attempts} == {str(first)}
    assert [a["attempt"] for a in data(acme_client.get(path, params={"limit": 2}))] == [3, 2]
    for limit in (0, 501, "1.0", "x"):
        err = error(acme_client.get(path, params={"limit": limit}), 400)
        assert err["field"] == "limit", err
    assert error(acme_client.get(path, params={"eventId": str(first)}), 400)["field"] == \
        "eventId"  # not a parameter of this route


def test_another_tenants_endpoint_is_not_found_on_every_route(acme_client, engine, tenant,
                                                             other_tenant):
    acme = add(acme_client, eventTypes=["order.*"])["endpoint"]
    with engine.begin() as conn:
        insert_attempt(conn, acme["id"], response_body="acme-only")
    before = stored(engine)
    globex = tenant_key(engine, "globex-app", other_tenant)
    missing = str(uuid.uuid4())
    with httpx.Client(base_url=str(acme_client.base_url), headers={"apikey": globex},
                      timeout=30) as api:
        assert data(api.get(HOOKS)) == []
        for endpoint_id in (acme["id"], missing):
            one = f"{HOOKS}/{endpoint_id}"
            for answer in (api.get(one), api.post(f"{one}/disable"),
                           api.post(f"{one}/enable"), api.delete(one),
                           api.get(f"{one}/attempts")):
                # The same answer as for an id nobody has: nothing tells the two apart.
                err = error(answer, 404)
                assert err == {"code": "not_found",
                               "message": f"no webhook endpoint with id {endpoint_id}"}
                assert "acme" not in answer.text and URL not in answer.text
        # Naming the other tenant is refused, and adds nothing to it.
        assert error(api.get(HOOKS, params={"tenantId": str(tenant)}), 400)["field"] == \
            "tenantId"
        assert error(api.post(HOOKS, json={"url": URL, "tenantId": str(tenant)}), 400)[
            "field"] == "tenantId"
        own = data(api.post(HOOKS, json={"url": URL, "tenantId": str(other_tenant)}), 201)
        assert data(api.get(HOOKS, params={"tenantId": str(other_tenant)})) == [
            own["endpoint"]]
    assert [r for r in stored(engine) if r[1] == tenant] == before  # acme's unchanged
    assert len(data(acme_client.get(f"{HOOKS}/{acme['id']}/attempts"))) == 1
    assert [e["id"] for e in data(acme_client.get(HOOKS))] == [acme["id"]]


def test_the_service_role_sees_every_tenant_and_names_the_tenant_it_adds_to(
        api, acme_client, tenant, other_tenant, engine):
    acme = add(acme_client)["endpoint"]
    err = error(api.post(HOOKS, json={"url": URL}), 400)
    assert err["field"] == "tenantId" and "names the endpoint's tenant" in err["message"]
    globex = add(api, tenantId=str(other_tenant))["endpoint"]
    assert globex["tenant_id"] == str(other_tenant)
    assert {e["id"] for e in data(api.get(HOOKS))} == {acme["id"], globex["id"]}
    assert [e["id"] for e in data(api.get(HOOKS, params={"tenantId": str(tenant)}))] == [
        acme["id"]]
    disabled = data(api.post(f"{HOOKS}/{acme['id']}/disable"))
    assert disabled["disabled_reason"] == "disabled by api:service-role"
    assert data(api.get(f"{HOOKS}/{acme['id']}/attempts")) == []
    unknown = error(api.post(HOOKS, json={"url": URL, "tenantId": str(uuid.uuid4())}), 400)
    assert unknown["field"] == "tenantId" and "no tenant" in unknown["message"]


def test_a_tenant_key_s_endpoint_may_never_reach_a_private_address(
        api, acme_client, tenant, engine):
    """Its host name could resolve inside the network at delivery, where the operator's
    POSTRELAY_WEBHOOK_ALLOW_PRIVATE lets their own endpoints reach: it is recorded as not
    private_allowed (tests/webhooks/test_private_allowed.py delivers to both kinds)."""
    theirs = add(acme_client)["endpoint"]
    ours = add(api, tenantId=str(tenant))["endpoint"]
    with engine.connect() as conn:
        allowed = dict(conn.execute(text(
            "SELECT id::text, private_allowed FROM mdm.aa_webhook_endpoint")).all())
    assert allowed == {theirs["id"]: False, ours["id"]: True}


def test_the_secret_is_answered_by_the_add_alone_and_a_ca_never(acme_client, engine):
    ca = trustme.CA()
    pem = ca.cert_pem.bytes().decode("ascii")
    added = add(acme_client, caPem=pem)
    secret, endpoint = added["secret"], added["endpoint"]
    assert endpoint["private_ca"] is True and "caPem" not in endpoint
    one = f"{HOOKS}/{endpoint['id']}"
    with engine.begin() as conn:
        insert_attempt(conn, endpoint["id"])
    answers = [acme_client.get(HOOKS), acme_client.get(one),
               acme_client.post(f"{one}/disable"), acme_client.post(f"{one}/enable"),
               acme_client.get(f"{one}/attempts"), acme_client.delete(one)]
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert secret not in answer.text, answer.request.url
        assert "whsec_" not in answer.text and "BEGIN CERTIFICATE" not in answer.text
    # The add's own answer carries the secret, never the CA either.
    assert "BEGIN CERTIFICATE" not in str(added)


NOW = datetime.now(UTC)
EXPIRED_CA = dated_ca("Old Acme CA", NOW - timedelta(days=400), NOW - timedelta(days=1))

BAD_BODIES = [
    ({"url": "gopher://hooks.acme.example/"}, "url", "the scheme must be http or https"),
    ({"url": ""}, "url", "must be a non-empty"),
    ({"url": 42}, "url", "valid string"),
    ({}, "url", "required"),
    ({"url": "http://127.0.0.1:8000/x"}, "url", "a tenant key adds endpoints at public"),
    ({"url": "http://localhost/x"}, "url", "a tenant key adds endpoints at public"),
    ({"url": URL, "eventTypes": [f"t{i}" for i in range(101)]}, "eventTypes", "at most 100"),
    ({"url": URL, "eventTypes": ["order placed"]}, "eventTypes", "no spaces"),
    ({"url": URL, "eventTypes": "order.*"}, "eventTypes", "valid list"),
    ({"url": URL, "eventTypes": [1]}, "eventTypes.0", "valid string"),
    ({"url": URL, "caPem": "not a certificate"}, "caPem", "at least one PEM CA certificate"),
    ({"url": URL, "caPem": EXPIRED_CA}, "caPem", "'CN=Old Acme CA' expired on"),
    ({"url": "http://hooks.acme.example/", "caPem": trustme.CA().cert_pem.bytes().decode()},
     "caPem", "for https:// endpoints only"),
    ({"url": URL, "event_types": ["order.*"]}, "event_types", "Extra inputs"),
    ({"url": URL, "tenantId": "acme"}, "tenantId", "UUID"),
]


@pytest.mark.parametrize(("body", "field", "rule"), BAD_BODIES,
                         ids=[f"{i}-{case[1]}" for i, case in enumerate(BAD_BODIES)])
def test_bad_input_is_400_naming_the_field_and_the_rule_and_writes_nothing(
        acme_client, engine, body, field, rule):
    err = error(acme_client.post(HOOKS, json=body), 400)
    assert err["code"] == "invalid_request" and err["field"] == field, err
    assert err["message"].startswith(f"{field}: ") and rule in err["message"], err
    assert stored(engine) == []


def test_private_addresses_follow_the_setting_for_the_service_role_only(
        database_url, engine, tenant):
    key = tenant_key(engine, "acme-app", tenant)
    with serve_database(database_url, SERVICE_KEY, webhook_allow_private=True,
                        **UNTHROTTLED) as url:
        with httpx.Client(base_url=url, headers={"apikey": SERVICE_KEY}, timeout=30) as api:
            own = data(api.post(HOOKS, json={"url": "http://127.0.0.1:8000/x",
                                             "tenantId": str(tenant)}), 201)
            assert own["endpoint"]["url"] == "http://127.0.0.1:8000/x"
        with httpx.Client(base_url=url, headers={"apikey": key}, timeout=30) as acme:
            err = error(acme.post(HOOKS, json={"url": "http://10.0.0.5/x"}), 400)
            assert err["field"] == "url" and "public addresses only" in err["message"]
            assert "POSTRELAY_WEBHOOK_ALLOW_PRIVATE" not in err["message"]
    assert len(stored(engine)) == 1


def test_every_route_needs_a_key(anonymous):
    one = f"{HOOKS}/{uuid.uuid4()}"
    for answer in (anonymous.get(HOOKS), anonymous.post(HOOKS, json={"url": URL}),
                   anonymous.get(one), anonymous.post(f"{one}/disable"),
                   anonymous.post(f"{one}/enable"), anonymous.delete(one),
                   anonymous.get(f"{one}/attempts")):
        assert error(answer, 401)["code"] == "unauthorized"
