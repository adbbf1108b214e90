"""postrelay.client's cancel, pause, limit, outbox and webhook methods against the served API.

Every test runs twice, on the sync `Client` and on the `AsyncClient` (each of its calls
awaited in a loop of its own), so the two are held to the same answers."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import trustme
from sqlalchemy import text

from postrelay.client import ApiError, AsyncClient, Client
from postrelay.relay import emit
from tests.api.conftest import SERVICE_KEY, tenant_key
from tests.api.test_client import answering
from tests.factories import insert_attempt, insert_job, insert_throttle, job_row


class Awaited:
    """An AsyncClient whose methods read like the sync Client's: each call opens one, awaits
    the method and closes it."""

    def __init__(self, url: str, key: str) -> None:
        self._url, self._key = url, key

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            async def awaited() -> Any:
                async with AsyncClient(self._url, self._key) as api:
                    return await getattr(api, name)(*args, **kwargs)

            return asyncio.run(awaited())

        return call


Connect = Callable[[str], Any]


@pytest.fixture(params=["sync", "async"])
def connect(request, api_url, clean_db) -> Iterator[Connect]:
    """Makes a client of the parametrized flavour for a key."""
    with ExitStack() as stack:
        def make(key: str) -> Any:
            if request.param == "async":
                return Awaited(api_url, key)
            return stack.enter_context(Client(api_url, key))

        yield make


@pytest.fixture
def admin(connect) -> Any:
    return connect(SERVICE_KEY)


@pytest.fixture
def acme(connect, engine, tenant) -> Any:
    """A client with a key of the `tenant` fixture's tenant."""
    return connect(tenant_key(engine, "acme-app", tenant))


@contextmanager
def refused(status: int, code: str | None = None, field: str | None = None) -> Iterator[None]:
    """The block raises the ApiError of this status (and code, and field)."""
    with pytest.raises(ApiError) as info:
        yield
    err = info.value
    assert err.status == status, err
    assert code is None or err.code == code, err
    assert field is None or err.field == field, err


def job(engine, tenant_id, **fields) -> uuid.UUID:
    with engine.begin() as conn:
        return insert_job(conn, tenant_id=tenant_id, **fields)


def state(engine, job_id: uuid.UUID) -> str:
    with engine.connect() as conn:
        return job_row(conn, job_id)["state"]  # type: ignore[no-any-return]


def test_cancel_job(admin, acme, engine, tenant, other_tenant):
    mine, theirs = job(engine, tenant), job(engine, other_tenant)
    assert acme.cancel_job(mine) == {"id": str(mine), "was": "pending"}
    assert state(engine, mine) == "failed"
    with refused(409, "conflict"):
        acme.cancel_job(str(mine))
    with refused(404, "not_found"):
        acme.cancel_job(theirs)  # another tenant's job is not found, like a missing one
    assert state(engine, theirs) == "pending"
    with refused(404, "not_found"):
        admin.cancel_job(uuid.uuid4())
    with refused(400, field="id"):
        admin.cancel_job("not-a-uuid")


def test_cancel_jobs(admin, acme, engine, tenant, other_tenant):
    mine = [job(engine, tenant), job(engine, tenant, kind="bulk_import")]
    theirs = job(engine, other_tenant)
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    assert acme.cancel_jobs(kind="reindex", created_from=hour_ago, limit=5) == 1
    assert acme.cancel_jobs(created_from=hour_ago.isoformat()) == 1  # the other kind
    assert [state(engine, j) for j in (*mine, theirs)] == ["failed", "failed", "pending"]
    with refused(400, field="tenantId"):
        acme.cancel_jobs(tenant_id=other_tenant)
    with refused(400, field="filter"):
        admin.cancel_jobs()
    with refused(400, field="limit"):
        admin.cancel_jobs(kind="reindex", limit=1001)
    assert admin.cancel_jobs(tenant_id=str(other_tenant), event_id=uuid.uuid4()) == 0
    assert admin.cancel_jobs(tenant_id=other_tenant) == 1


def test_pause_list_and_resume(admin, acme, tenant, other_tenant):
    made = admin.pause("email_send", tenant)
    assert (made["kind"], made["tenantId"], made["pausedBy"]) == (
        "email_send", str(tenant), "api:service-role")
    assert admin.pause(kind="email_send", tenant_id=str(tenant)) == made  # paused already
    assert admin.pause(everything=True)["kind"] is None
    admin.pause(tenant_id=other_tenant)
    assert [(p["kind"], p["tenantId"]) for p in admin.list_pauses()] == [
        ("email_send", str(tenant)), (None, None), (None, str(other_tenant))]
    # acme's key sees its own pauses and the installation-wide one, not globex's.
    assert [(p["kind"], p["tenantId"]) for p in acme.list_pauses()] == [
        ("email_send", str(tenant)), (None, None)]
    assert admin.resume(everything=True)["pausedBy"] == "api:service-role"
    with refused(404, "not_found"):
        admin.resume(everything=True)
    with refused(400, field="scope"):
        admin.pause()


def test_a_tenant_key_pauses_and_resumes_its_own_tenant_only(admin, acme, tenant,
                                                             other_tenant):
    assert acme.pause("reindex")["tenantId"] == str(tenant)
    assert acme.resume("reindex")["pausedBy"].startswith("api:key:")
    with refused(400, field="all"):
        acme.pause(everything=True)
    with refused(400, field="tenantId"):
        acme.pause("reindex", other_tenant)
    admin.pause("email_send", tenant)
    with refused(403, "operator_pause"):
        acme.resume("email_send")
    assert len(admin.list_pauses()) == 1


def test_set_list_and_remove_limits(admin, acme, tenant):
    made = admin.set_limit("email_send", rate="14/s", concurrency=20, key="domain")
    assert (made["kind"], made["tenantId"], made["ratePerSec"], made["burst"],
            made["concurrency"], made["key"], made["createdBy"]) == (
        "email_send", None, 14.0, 14, 20, "domain", "api:service-role")
    own = acme.set_limit("reindex", rate=5, burst=2)
    assert (own["tenantId"], own["ratePerSec"], own["burst"]) == (str(tenant), 5.0, 2)
    assert [(lim["kind"], lim["tenantId"]) for lim in admin.list_limits()] == [
        ("email_send", None), ("reindex", str(tenant))]
    assert admin.remove_limit("email_send")["concurrency"] == 20
    with refused(404, "not_found"):
        admin.remove_limit("email_send")
    assert acme.remove_limit("reindex", tenant)["kind"] == "reindex"
    assert admin.list_limits() == []
    with refused(400, field="rate"):
        admin.set_limit("reindex")
    with refused(400, field="kind"):
        admin.set_limit("nope", concurrency=1)


def test_a_tenant_key_limits_its_own_tenant_only(admin, acme, tenant, other_tenant):
    admin.set_limit("reindex", concurrency=1, tenant_id=other_tenant)
    admin.set_limit("email_send", rate="14/s")
    with refused(400, field="tenantId"):
        acme.set_limit("reindex", concurrency=4, tenant_id=other_tenant)
    with refused(403, "kind_wide_limit"):
        acme.set_limit("email_send", rate="1000000/s")
    with refused(404, "not_found"):  # its own limit of the kind: there is none
        acme.remove_limit("email_send")
    admin.set_limit("bulk_import", concurrency=1, tenant_id=tenant)
    with refused(403, "operator_limit"):
        acme.remove_limit("bulk_import")
    assert {(lim["kind"], lim["tenantId"]) for lim in acme.list_limits()} == {
        ("email_send", None), ("bulk_import", str(tenant))}


def test_list_throttles(admin, acme, engine, tenant, other_tenant):
    assert admin.list_throttles() == []
    with engine.begin() as conn:
        insert_throttle(conn, reason="SMTP localhost:25 said mail: 454 4.7.0 slow down")
        for owner, endpoint in ((tenant, "ep-acme"), (other_tenant, "ep-globex")):
            insert_throttle(conn, kind="outbox_dispatch", key_path=["endpoint_id"],
                            key=endpoint, tenant_id=owner, reason="HTTP 429")
    assert admin.list_limits() == []  # the throttles are no limits
    assert [(t["kind"], t["key"], t["value"]) for t in admin.list_throttles()] == [
        ("email_send", None, ""), ("outbox_dispatch", "endpoint_id", "ep-acme"),
        ("outbox_dispatch", "endpoint_id", "ep-globex")]
    smtp, hook = acme.list_throttles()  # its own and the shared SMTP server's
    assert (smtp["ratePerSec"], smtp["recoversTo"]) == (0.0, 14.0)  # paused
    assert (hook["value"], hook["tenantId"], hook["reason"]) == ("ep-acme", str(tenant),
                                                                 "HTTP 429")


def order(engine, tenant_id, number: int) -> uuid.UUID:
    with engine.begin() as conn:
        return emit(conn, "order.placed", {"order": number},  # type: ignore[return-value]
                    tenant_id=tenant_id, aggregate_type="order", aggregate_id=number)


def handled(engine, event_id: uuid.UUID) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_outbox_event SET handled_at = now() WHERE id = :id"),
                     {"id": event_id})


def test_outbox_status_and_one_event(admin, acme, engine, tenant, other_tenant):
    empty = admin.get_outbox_status()
    assert empty == {"backlog": 0, "lag_secs": None, "dead": 0, "handled": 0, "retrying": 0,
                     "dead_events": []}
    mine, theirs = order(engine, tenant, 1), order(engine, other_tenant, 2)
    handled(engine, theirs)
    status = admin.get_outbox_status()
    assert (status["backlog"], status["handled"]) == (1, 1)
    assert (acme.get_outbox_status()["backlog"], acme.get_outbox_status()["handled"]) == (1, 0)
    event = acme.get_outbox_event(mine)
    assert (event["id"], event["status"], event["payload"], event["jobs"]) == (
        str(mine), "pending", {"order": 1}, [])
    assert admin.get_outbox_event(str(theirs))["status"] == "handled"
    with refused(404, "not_found"):
        acme.get_outbox_event(theirs)
    with refused(404, "not_found"):
        admin.get_outbox_event(uuid.uuid4())


def test_replay_outbox(admin, acme, engine, tenant, other_tenant):
    mine, theirs = order(engine, tenant, 1), order(engine, other_tenant, 2)
    handled(engine, mine)
    handled(engine, theirs)
    assert acme.replay_outbox(mine) == 1
    assert acme.get_outbox_event(mine)["status"] == "pending"
    with refused(404, "not_found"):
        acme.replay_outbox(theirs)
    assert admin.get_outbox_event(theirs)["status"] == "handled"
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    assert admin.replay_outbox(until=hour_ago) == 0
    assert admin.replay_outbox(since=hour_ago, until=datetime.now(UTC) + timedelta(hours=1)) == 2
    # A time without a zone is UTC.
    assert admin.replay_outbox(since=hour_ago.replace(tzinfo=None).isoformat()) == 2
    with refused(400, field="eventId"):
        admin.replay_outbox()
    with refused(400, field="until"):
        admin.replay_outbox(since=hour_ago, until=hour_ago)


@pytest.mark.parametrize(("body", "call"), [
    (b'{"data": [], "meta": null}', lambda api: api.list_throttles()),
    (b'{"data": [], "meta": {"throttled": {}}}', lambda api: api.list_throttles()),
    (b'{"data": {"cancelled": 1.5}, "meta": null}', lambda api: api.cancel_jobs(kind="x")),
    (b'{"data": {"replayed": true}, "meta": null}', lambda api: api.replay_outbox("x")),
    (b'{"data": [], "meta": null}', lambda api: api.get_outbox_status()),
    (b'{"data": {"endpoint": {"id": "x"}}, "meta": null}',
     lambda api: api.add_webhook("https://x.example/", tenant_id=uuid.uuid4())),
    (b'{"data": {"secret": "whsec_x", "endpoint": null}, "meta": null}',
     lambda api: api.add_webhook("https://x.example/", tenant_id=uuid.uuid4())),
])
def test_an_answer_of_another_shape_is_an_api_error(body, call):
    with answering(200, body, {"Content-Type": "application/json"}) as url, \
            Client(url, SERVICE_KEY) as api, refused(200, "unexpected_answer"):
        call(api)


HOOK_URL = "https://hooks.acme.example/in"


def test_add_list_get_disable_enable_and_delete(acme, tenant):
    added = acme.add_webhook(HOOK_URL, event_types=("order.*", "user.created"))
    endpoint, secret = added["endpoint"], added["secret"]
    assert secret.startswith("whsec_")
    assert (endpoint["tenant_id"], endpoint["event_types"]) == (
        str(tenant), ["order.*", "user.created"])
    assert acme.list_webhooks() == [endpoint]
    assert acme.get_webhook(uuid.UUID(endpoint["id"])) == endpoint
    assert acme.disable_webhook(endpoint["id"])["enabled"] is False
    assert acme.enable_webhook(endpoint["id"])["enabled"] is True
    assert acme.list_webhook_attempts(endpoint["id"]) == []
    assert acme.delete_webhook(endpoint["id"]) is None
    with refused(404, "not_found"):
        acme.get_webhook(endpoint["id"])
    assert acme.list_webhooks() == []


def test_an_endpoint_the_operator_disabled_is_the_operator_s_to_enable(admin, acme):
    endpoint = acme.add_webhook(HOOK_URL)["endpoint"]
    assert admin.disable_webhook(endpoint["id"])["disabled_by"] == "operator"
    with refused(403, "disabled_by_operator"):
        acme.enable_webhook(endpoint["id"])
    kept = acme.disable_webhook(endpoint["id"])
    assert (kept["enabled"], kept["disabled_by"]) == (False, "operator")
    assert admin.enable_webhook(endpoint["id"])["disabled_by"] is None
    assert acme.disable_webhook(endpoint["id"])["disabled_by"] == "tenant"
    assert acme.enable_webhook(endpoint["id"])["enabled"] is True


def test_attempts_and_their_limit(acme, engine):
    endpoint = acme.add_webhook(HOOK_URL)["endpoint"]
    with engine.begin() as conn:
        for n in (1, 2, 3):
            insert_attempt(conn, endpoint["id"], attempt=n, ago_secs=10 - n)
    assert [a["attempt"] for a in acme.list_webhook_attempts(endpoint["id"])] == [3, 2, 1]
    assert [a["attempt"] for a in acme.list_webhook_attempts(endpoint["id"], limit=1)] == [3]
    with refused(400, field="limit"):
        acme.list_webhook_attempts(endpoint["id"], limit=0)


def test_a_tenant_key_reaches_its_own_tenants_endpoints_only(admin, acme, connect, engine,
                                                            tenant, other_tenant):
    theirs = admin.add_webhook(HOOK_URL, tenant_id=other_tenant)["endpoint"]
    mine = acme.add_webhook(HOOK_URL)["endpoint"]
    assert {e["id"] for e in admin.list_webhooks()} == {theirs["id"], mine["id"]}
    assert [e["id"] for e in admin.list_webhooks(tenant_id=str(tenant))] == [mine["id"]]
    assert acme.list_webhooks() == [mine]
    for call in (acme.get_webhook, acme.disable_webhook, acme.enable_webhook,
                 acme.delete_webhook, acme.list_webhook_attempts):
        with refused(404, "not_found"):
            call(theirs["id"])
    with refused(400, field="tenantId"):
        acme.add_webhook(HOOK_URL, tenant_id=other_tenant)
    with refused(400, field="tenantId"):
        acme.list_webhooks(tenant_id=other_tenant)
    assert admin.get_webhook(theirs["id"]) == theirs  # untouched
    globex = connect(tenant_key(engine, "globex-app", other_tenant))
    assert globex.list_webhooks() == [theirs]


def test_bad_input_names_the_field(admin, acme, tenant):
    with refused(400, field="tenantId"):
        admin.add_webhook(HOOK_URL)  # the service role names the tenant
    with refused(400, field="url"):
        acme.add_webhook("ftp://hooks.acme.example/")
    with refused(400, field="eventTypes"):
        acme.add_webhook(HOOK_URL, event_types="order.*")  # one string, not a list of them
    with refused(400, field="caPem"):
        acme.add_webhook(HOOK_URL, ca_pem="not a certificate")
    assert acme.list_webhooks() == []
    ca = trustme.CA().cert_pem.bytes().decode("ascii")
    assert acme.add_webhook(HOOK_URL, ca_pem=ca)["endpoint"]["private_ca"] is True
