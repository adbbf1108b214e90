"""The tenant walk: every route of the served application — the HTTP API and every page and
form of the dashboard — exercised with tenant A's credentials against tenant B's ids, over
real HTTP. Each answer must be a refusal (403/404, or 400 where A names B's tenant in a
field) or A's own data, with nothing of B's in the body; afterwards B's rows must be
exactly as they were.

The walk table (`WALK`) is checked against `app.routes` first: a route that the table does
not cover fails the test, so a new route cannot forget its tenant scoping.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote_plus

import httpx
import pytest
from fastapi.routing import APIRoute
from sqlalchemy import Engine, text
from starlette.routing import Mount, Route

from postrelay.core.db import Database, sqlalchemy_url
from postrelay.core.settings import Settings
from postrelay.queue import limit_set, pause
from postrelay.queue.cron import cron_create
from postrelay.web import create_web_app
from tests.dashboard.conftest import (
    SERVICE_KEY,
    csrf_of,
    insert_email,
    insert_event,
    login_token,
    sign_in,
    tenant_key,
)
from tests.factories import insert_job

MARK = "globex-secret-7f3a"  # in every text field of tenant B's rows; A never sends it
B_CRON = "gx-nightly"  # names and keys A may send (and see echoed in a refusal)
B_KEY = "gx-order-42"
B_RECIPIENT = "ann@gx-mail.example"
REFUSED = {403, 404}


@dataclass
class B:
    """Tenant B's rows, and everything that would betray them in an answer."""

    tenant: uuid.UUID
    dead_job: uuid.UUID
    done_job: uuid.UUID
    pending_job: uuid.UUID
    email_log: uuid.UUID
    dead_event: uuid.UUID
    handled_event: uuid.UUID
    cron_name: str
    idempotency_key: str

    def secrets(self) -> list[str]:
        ids = (self.tenant, self.dead_job, self.done_job, self.pending_job, self.email_log,
               self.dead_event, self.handled_event)
        return [MARK, "globex", self.cron_name, self.idempotency_key, B_RECIPIENT,
                *(str(i) for i in ids)]


@dataclass
class Walk:
    api: httpx.Client  # tenant A's key
    dash: httpx.Client  # tenant A's dashboard session
    url: str
    a_key: str
    a: A
    b: B

    def csrf(self) -> str:
        return csrf_of(self.dash)

    def form(self, path: str, **fields: Any) -> httpx.Response:
        return self.dash.post(path, data={"csrf": self.csrf(), **fields})


# Each entry: the route as (method, path template) and how to exercise it with A's
# credentials against B's ids. A probe returns its answers and the statuses allowed for
# them; `OWN` means "A's own view": 200 (or a redirect back into A's pages).
# A third element names values of B's that the answer may show because A's own row holds
# them (an id A's payload carried).
Probe = Callable[[Walk], list[tuple[Any, ...]]]
OWN = {200, 303}


def one(response: httpx.Response, allowed: set[int]) -> list[tuple[httpx.Response, set[int]]]:
    return [(response, allowed)]


def public(path: str) -> Probe:
    """A route that needs no credentials and shows no tenant's data."""
    return lambda w: one(w.api.get(path), {200})


WALK: dict[tuple[str, str], Probe] = {
    # --- the API: public and service-role routes -----------------------------------------
    ("GET", "/openapi.json"): public("/openapi.json"),
    ("GET", "/docs"): public("/docs"),
    ("GET", "/docs/oauth2-redirect"): public("/docs/oauth2-redirect"),
    ("GET", "/redoc"): public("/redoc"),
    ("GET", "/healthz"): public("/healthz"),
    ("GET", "/readyz"): public("/readyz"),
    # One-click unsubscribe: no credentials, the signed token is the authority; a token that
    # is not one of this installation's (or no links set up) reaches nobody's data.
    ("GET", "/u/{token}"): lambda w: one(w.api.get(f"/u/{w.b.tenant}"), {400, 404}),
    ("POST", "/u/{token}"): lambda w: one(w.api.post(f"/u/{w.b.tenant}"), {400, 404}),
    ("GET", "/metrics"): lambda w: one(w.api.get("/metrics"), {401}),  # every tenant's counts
    # Provider webhooks: no API key, the provider's signature or password is the authority,
    # and the answer is counts only. Not configured here: 404 whatever the request says
    # about B's message (tests/feedback/test_webhook_*.py cover them configured).
    ("POST", "/v1/email/feedback/ses"): lambda w: one(w.api.post(
        "/v1/email/feedback/ses", json={"Type": "Notification", "TopicArn": MARK}), {404}),
    ("POST", "/v1/email/feedback/postmark"): lambda w: one(w.api.post(
        "/v1/email/feedback/postmark", json={"RecordType": "Bounce", "Email": B_RECIPIENT}),
        {404}),
    ("POST", "/v1/email/feedback/sendgrid"): lambda w: one(w.api.post(
        "/v1/email/feedback/sendgrid", json=[{"event": "bounce", "email": B_RECIPIENT}]),
        {404}),
    # --- the API: jobs and the DLQ -------------------------------------------------------
    ("POST", "/v1/functions/jobs"): lambda w: [
        # Naming B's tenant is refused as a bad field, and so is a repeat of B's key.
        (w.api.post("/v1/functions/jobs", json={"kind": "reindex",
                                                "tenantId": str(w.b.tenant)}), {400}),
        (w.api.post("/v1/functions/jobs", json={"kind": "reindex",
                                                "idempotencyKey": w.b.idempotency_key}),
         {201}),  # a new job of A's: B's key is no lookup into B's jobs
    ],
    ("GET", "/v1/functions/jobs"): lambda w: [
        *[(w.api.get("/v1/functions/jobs", params={"status": s}), {200})
          for s in ("pending", "done", "dlq")],
        (w.api.get("/v1/functions/jobs", params={"limit": 500}), {200}),
    ],
    ("GET", "/v1/functions/jobs/{id}"): lambda w: [
        (w.api.get(f"/v1/functions/jobs/{j}"), {404})
        for j in (w.b.dead_job, w.b.done_job, w.b.pending_job)],
    ("GET", "/v1/functions/jobs/dlq"): lambda w: one(w.api.get("/v1/functions/jobs/dlq"),
                                                     {200}),
    ("POST", "/v1/functions/jobs/dlq/requeue"): lambda w: one(
        w.api.post("/v1/functions/jobs/dlq/requeue"), {200}),
    ("POST", "/v1/functions/jobs/{id}/retry"): lambda w: one(
        w.api.post(f"/v1/functions/jobs/{w.b.dead_job}/retry"), {404}),
    ("POST", "/v1/functions/jobs/{id}/cancel"): lambda w: [
        (w.api.post(f"/v1/functions/jobs/{j}/cancel"), {404})
        for j in (w.b.pending_job, w.b.done_job, w.b.dead_job)],
    ("POST", "/v1/functions/jobs/cancel"): lambda w: [
        # Scoped to A's own jobs: B's pending job stays pending (checked after the walk).
        (w.api.post("/v1/functions/jobs/cancel", json={"kind": "reindex"}), {200}),
        (w.api.post("/v1/functions/jobs/cancel", json={"tenantId": str(w.b.tenant)}), {400}),
    ],
    # --- the API: pauses (B has one of its own, which A must neither see nor lift) -----
    ("GET", "/v1/functions/pauses"): lambda w: one(w.api.get("/v1/functions/pauses"), {200}),
    ("POST", "/v1/functions/pauses"): lambda w: [
        (w.api.post("/v1/functions/pauses", json={"tenantId": str(w.b.tenant)}), {400}),
        (w.api.post("/v1/functions/pauses", json={"all": True}), {400}),
        (w.api.post("/v1/functions/pauses", json={"kind": "bulk_import"}), {201}),  # A's own
    ],
    ("POST", "/v1/functions/pauses/resume"): lambda w: [
        (w.api.post("/v1/functions/pauses/resume",
                    json={"tenantId": str(w.b.tenant), "kind": "reindex"}), {400}),
        (w.api.post("/v1/functions/pauses/resume", json={"kind": "reindex"}), {404}),
    ],
    # --- the API: limits (B has one of its own) -----------------------------------------
    ("GET", "/v1/functions/limits"): lambda w: one(w.api.get("/v1/functions/limits"), {200}),
    ("POST", "/v1/functions/limits"): lambda w: [
        (w.api.post("/v1/functions/limits", json={"kind": "reindex", "concurrency": 1,
                                                  "tenantId": str(w.b.tenant)}), {400}),
        (w.api.post("/v1/functions/limits", json={"kind": "bulk_import", "concurrency": 2}),
         {200}),  # A's own
    ],
    ("POST", "/v1/functions/limits/remove"): lambda w: [
        (w.api.post("/v1/functions/limits/remove",
                    json={"kind": "reindex", "tenantId": str(w.b.tenant)}), {400}),
        (w.api.post("/v1/functions/limits/remove", json={"kind": "reindex"}), {404}),
    ],
    ("DELETE", "/v1/functions/jobs/{id}"): lambda w: one(
        w.api.delete(f"/v1/functions/jobs/{w.b.dead_job}"), {404}),
    # --- the API: cron -------------------------------------------------------------------
    ("POST", "/v1/functions/cron"): lambda w: [
        (w.api.post("/v1/functions/cron", json={
            "name": w.b.cron_name, "schedule": "0 3 * * *", "kind": "reindex",
            "tenantId": str(w.b.tenant)}), {400}),
        # B's name is free for A: a 201, never a 409 that would betray B's entry (and A's
        # entry is deleted again, so that the delete probes meet B's name alone).
        (w.api.post("/v1/functions/cron", json={
            "name": w.b.cron_name, "schedule": "0 3 * * *", "kind": "reindex"}), {201}),
        (w.api.delete(f"/v1/functions/cron/{w.b.cron_name}"), {200}),
    ],
    ("GET", "/v1/functions/cron"): lambda w: one(w.api.get("/v1/functions/cron"), {200}),
    ("DELETE", "/v1/functions/cron/{name}"): lambda w: [
        (w.api.delete(f"/v1/functions/cron/{w.b.cron_name}"), {404}),
        (w.api.delete(f"/v1/functions/cron/{w.b.cron_name}",
                      params={"tenantId": str(w.b.tenant)}), {400}),
    ],
    # --- the API: the outbox -------------------------------------------------------------
    ("GET", "/v1/functions/outbox/status"): lambda w: one(
        w.api.get("/v1/functions/outbox/status"), {200}),
    ("GET", "/v1/functions/outbox/events/{id}"): lambda w: [
        *[(w.api.get(f"/v1/functions/outbox/events/{e}"), {404})
          for e in (w.b.dead_event, w.b.handled_event)],
        # A's event linked to B's job: the link is A's row, B's job must not show.
        (w.api.get(f"/v1/functions/outbox/events/{w.a.event}"), {200}),
    ],
    ("POST", "/v1/functions/outbox/replay"): lambda w: [
        (w.api.post("/v1/functions/outbox/replay", json={"eventId": str(w.b.dead_event)}),
         {404}),
        (w.api.post("/v1/functions/outbox/replay",
                    json={"since": "2000-01-01T00:00:00Z"}), {200}),  # A's events only
    ],
    # --- the dashboard -------------------------------------------------------------------
    ("GET", "/dashboard/login"): lambda w: one(w.dash.get("/dashboard/login"), {303}),
    ("POST", "/dashboard/login"): lambda w: one(_sign_in_again(w), {303}),
    ("POST", "/dashboard/logout"): lambda w: one(_sign_out_elsewhere(w), {303}),
    ("GET", "/dashboard/"): lambda w: one(w.dash.get("/dashboard/",
                                                     params={"tenant": str(w.b.tenant)}),
                                          {200}),
    ("GET", "/dashboard/panels"): lambda w: one(w.dash.get("/dashboard/panels"), {200}),
    ("GET", "/dashboard/jobs"): lambda w: [
        *[(w.dash.get("/dashboard/jobs", params={"status": s, "tenant": str(w.b.tenant)}),
           {200}) for s in ("pending", "running", "done", "failed", "dlq")],
        (w.dash.get("/dashboard/jobs", params={"q": str(w.b.dead_job)}), {200}),
        (w.dash.get("/dashboard/jobs", params={"q": w.b.idempotency_key}), OWN),
    ],
    ("GET", "/dashboard/jobs/{job_id}"): lambda w: [
        *[(w.dash.get(f"/dashboard/jobs/{j}"), {404})
          for j in (w.b.dead_job, w.b.done_job, w.b.pending_job)],
        (w.dash.get(f"/dashboard/jobs/{w.a.job}"), {200}),  # linked to B's event
    ],
    ("GET", "/dashboard/dlq"): lambda w: one(
        w.dash.get("/dashboard/dlq", params={"tenant": str(w.b.tenant)}), {200}),
    ("POST", "/dashboard/dlq/confirm"): lambda w: [
        (w.form("/dashboard/dlq/confirm", action="retry", ids=str(w.b.dead_job)), {303}),
        (w.form("/dashboard/dlq/confirm", action="discard", scope="matching",
                tenant=str(w.b.tenant)), OWN),
    ],
    ("GET", "/dashboard/pauses"): lambda w: one(w.dash.get("/dashboard/pauses"), {200}),
    ("POST", "/dashboard/pauses"): lambda w: [
        # The tenant field is ignored for a tenant session: A's own scope, never B's.
        (w.form("/dashboard/pauses", action="resume", kind="reindex",
                tenant=str(w.b.tenant)), {404}),
        (w.form("/dashboard/pauses", action="pause", kind="virus_scan",
                tenant=str(w.b.tenant)), OWN),
        (w.form("/dashboard/pauses", action="pause", all="1"), {400}),
    ],
    ("POST", "/dashboard/limits"): lambda w: [
        # As with pauses: a tenant session's scope is its own tenant, whatever it sends.
        (w.form("/dashboard/limits", action="remove", kind="reindex",
                tenant=str(w.b.tenant)), {404}),
        (w.form("/dashboard/limits", action="set", kind="virus_scan", concurrency="2",
                tenant=str(w.b.tenant)), OWN),
    ],
    ("POST", "/dashboard/jobs/{job_id}/cancel"): lambda w: [
        (w.form(f"/dashboard/jobs/{j}/cancel"), {404})
        for j in (w.b.pending_job, w.b.done_job, w.b.dead_job)],
    ("POST", "/dashboard/dlq/apply"): lambda w: [
        (w.form("/dashboard/dlq/apply", action="discard", ids=str(w.b.dead_job)), {303}),
        (w.form("/dashboard/dlq/apply", action="retry", scope="matching",
                tenant=str(w.b.tenant)), {303}),
    ],
    ("GET", "/dashboard/cron"): lambda w: one(w.dash.get("/dashboard/cron"), {200}),
    ("POST", "/dashboard/cron"): lambda w: [
        (w.form("/dashboard/cron", name="walk-b", schedule="0 3 * * *", kind="reindex",
                tenant=str(w.b.tenant)), {400}),
        (w.form("/dashboard/cron", name=w.b.cron_name, schedule="0 3 * * *",
                kind="reindex"), {303}),
        (w.form(f"/dashboard/cron/{w.b.cron_name}/delete"), {303}),
    ],
    ("POST", "/dashboard/cron/{name}/delete"): lambda w: [
        (w.form(f"/dashboard/cron/{w.b.cron_name}/delete"), {404}),
        (w.form(f"/dashboard/cron/{w.b.cron_name}/delete", tenant=str(w.b.tenant)),
         {404}),
    ],
    ("GET", "/dashboard/outbox"): lambda w: one(w.dash.get("/dashboard/outbox"), {200}),
    ("POST", "/dashboard/outbox/replay"): lambda w: [
        (w.form("/dashboard/outbox/replay", event_id=str(w.b.dead_event)), {404}),
        (w.form("/dashboard/outbox/replay", since="2000-01-01T00:00"), {303}),
    ],
    ("GET", "/dashboard/emails"): lambda w: [
        (w.dash.get("/dashboard/emails", params={"tenant": str(w.b.tenant)}), {200}),
        (w.dash.get("/dashboard/emails", params={"recipient": B_RECIPIENT}),
         {200}),
    ],
    ("GET", "/dashboard/emails/{log_id}"): lambda w: [
        (w.dash.get(f"/dashboard/emails/{w.b.email_log}"), {404}),
        # A's row holding B's event and job ids: the ids are A's row's own columns (shown
        # as "not kept"), B's event and job are never joined.
        (w.dash.get(f"/dashboard/emails/{w.a.email_log}"), {200},
         {str(w.b.handled_event), str(w.b.dead_job)}),
    ],
    ("GET", "/dashboard/emails/{log_id}/preview"): lambda w: [
        (w.dash.get(f"/dashboard/emails/{w.b.email_log}/preview"), {404}),
        (w.dash.get(f"/dashboard/emails/{w.a.email_log}/preview"), {200, 404},
         {str(w.b.handled_event), str(w.b.dead_job)}),
    ],
    ("GET", "/dashboard/static/{path}"): lambda w: one(
        w.dash.get("/dashboard/static/dashboard.js"), {200}),
}


def _sign_in_again(w: Walk) -> httpx.Response:
    with httpx.Client(base_url=w.url, timeout=30) as fresh:
        response = fresh.post("/dashboard/login", data={"csrf": login_token(fresh),
                                                         "key": w.a_key, "next": "/"})
        page = fresh.get("/dashboard/")
        assert page.status_code == 200
        _assert_clean(w.b, page, "GET /dashboard/ after signing in")
        return response


def _sign_out_elsewhere(w: Walk) -> httpx.Response:
    # A second session of A's, so the walk's own session stays signed in.
    with httpx.Client(base_url=w.url, timeout=30) as other:
        sign_in(other, w.a_key)
        return other.post("/dashboard/logout", data={"csrf": csrf_of(other)})


def app_routes() -> set[tuple[str, str]]:
    """Every (method, path) the application serves, the dashboard's mount included."""
    settings = Settings(database_url="postgresql://unused@127.0.0.1:1/x",
                        service_role_key=SERVICE_KEY)
    db = Database(url=sqlalchemy_url(settings.database_url))
    try:
        return set(_walk_routes(create_web_app(settings, db).routes, ""))
    finally:
        db.close()


def _walk_routes(routes: list[Any], prefix: str) -> Iterator[tuple[str, str]]:
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:  # FastAPI's include_router keeps the router it included
            context = getattr(route, "include_context", None)
            yield from _walk_routes(included.routes,
                                    prefix + (getattr(context, "prefix", "") or ""))
        elif isinstance(route, Mount):
            inner = getattr(route.app, "routes", None)
            if inner is None:  # static files: one route with any path below it
                yield "GET", f"{prefix}{route.path}/{{path}}"
            else:
                yield from _walk_routes(inner, prefix + route.path)
        elif isinstance(route, APIRoute | Route):
            for method in sorted((route.methods or {"GET"}) - {"HEAD"}):
                yield method, prefix + route.path
        else:  # a websocket or another kind of route the walk does not know how to take
            yield "?", prefix + getattr(route, "path", repr(route))


def test_the_walk_covers_every_route():
    served = app_routes()
    missing = served - WALK.keys()
    stale = WALK.keys() - served
    assert not missing, f"routes the tenant walk does not cover (add them to WALK): {missing}"
    assert not stale, f"WALK entries for routes that no longer exist: {stale}"


# --- the walk ------------------------------------------------------------------------------

@pytest.fixture
def b_rows(engine: Engine, other_tenant: uuid.UUID) -> B:
    now = datetime.now(UTC)
    payload = {"secret": MARK, "email": B_RECIPIENT}
    with engine.begin() as conn:
        dead = insert_job(conn, tenant_id=other_tenant, status="dlq", kind="email_send",
                          payload=payload, attempts=3, max_attempts=3, last_error=MARK,
                          completed_at=now - timedelta(minutes=1),
                          idempotency_key=B_KEY)
        done = insert_job(conn, tenant_id=other_tenant, status="done", payload=payload,
                          completed_at=now - timedelta(minutes=2), idempotency_key=B_KEY)
        pending = insert_job(conn, tenant_id=other_tenant, payload=payload,
                             available_at=now - timedelta(minutes=5))
        dead_event = insert_event(conn, other_tenant, payload=payload, last_error=MARK,
                                  attempts=10, dead_at=now, aggregate_id=MARK,
                                  event_type=f"{MARK}.dead")
        handled_event = insert_event(conn, other_tenant, payload=payload, handled_at=now,
                                     aggregate_id=MARK, event_type=f"{MARK}.handled")
        conn.execute(text("INSERT INTO mdm.aa_outbox_delivery (event_id, route, job_id) "
                          "VALUES (:e, :r, :j)"),
                     {"e": handled_event, "r": f"email:{MARK}", "j": dead})
        log = insert_email(conn, other_tenant, job_id=dead, event_id=handled_event,
                           subject=MARK, recipients=[B_RECIPIENT],
                           from_address=f"{MARK}@globex.example", status="bounced",
                           smtp_response=MARK, error=MARK)
        cron_create(conn, B_CRON, "0 3 * * *", "reindex", payload,
                    tenant_id=other_tenant, created_by=MARK)
        conn.execute(text("INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, "
                          "actor, detail) VALUES (:j, :t, 'email_send', 'job_dlq', :m, "
                          "CAST(:d AS jsonb))"),
                     {"j": dead, "t": other_tenant, "m": MARK, "d": f'{{"why": "{MARK}"}}'})
        pause(conn, actor=MARK, kind="reindex", tenant_id=other_tenant)
        limit_set(conn, actor=MARK, kind="reindex", tenant_id=other_tenant, concurrency=7,
                  key=MARK.replace("-", "_"))
    return B(other_tenant, dead, done, pending, log, dead_event, handled_event,
             B_CRON, B_KEY)


@dataclass
class A:
    """A's own rows that point at B's ids (as an event id copied from a payload would, or
    a delivery link written by hand): A may read them, but never B's rows through them."""

    email_log: uuid.UUID  # event_id and job_id are B's
    job: uuid.UUID  # linked to B's event
    event: uuid.UUID  # linked to B's job


@pytest.fixture
def a_rows(engine: Engine, tenant: uuid.UUID, b_rows: B) -> A:
    """A's own rows, so that A's pages and lists have something to show."""
    now = datetime.now(UTC)
    with engine.begin() as conn:
        job = insert_job(conn, tenant_id=tenant, status="dlq", attempts=3, max_attempts=3,
                         completed_at=now - timedelta(minutes=1), last_error="acme boom")
        insert_job(conn, tenant_id=tenant, status="done", completed_at=now)
        event = insert_event(conn, tenant, dead_at=now, last_error="acme err")
        insert_email(conn, tenant, job_id=job, event_id=event, subject="Acme hello")
        cron_create(conn, "acme-nightly", "0 3 * * *", "reindex", {}, tenant_id=tenant)
        crossed = insert_email(conn, tenant, job_id=b_rows.dead_job,
                               event_id=b_rows.handled_event, subject="Acme crossed")
        conn.execute(text("INSERT INTO mdm.aa_outbox_delivery (event_id, route, job_id) "
                          "VALUES (:be, 'acme-route', :aj), (:ae, 'acme-route', :bj)"),
                     {"be": b_rows.handled_event, "aj": job, "ae": event,
                      "bj": b_rows.pending_job})
    return A(crossed, job, event)


def b_snapshot(engine: Engine, b: B) -> dict[str, list[Any]]:
    """Everything of B's that a route could change."""
    queries = {
        "jobs": "SELECT id, status::text, attempts, available_at, completed_at, payload "
                "FROM mdm.aa_job WHERE tenant_id = :t ORDER BY id",
        "audit": "SELECT job_id, action, actor FROM mdm.aa_job_audit WHERE tenant_id = :t "
                 "ORDER BY id",
        "cron": "SELECT id, name, schedule, payload FROM mdm.aa_cron_entry WHERE tenant_id = :t "
                "ORDER BY id",
        "events": "SELECT id, handled_at, dead_at, attempts, available_at, last_error "
                  "FROM mdm.aa_outbox_event WHERE tenant_id = :t ORDER BY id",
        "emails": "SELECT id, status FROM mdm.aa_email_log WHERE tenant_id = :t ORDER BY id",
        "pauses": "SELECT job_kind::text, paused_by, paused_at FROM mdm.aa_job_pause "
                  "WHERE tenant_id = :t ORDER BY id",
        "limits": "SELECT job_kind::text, key_path, concurrency, created_by "
                  "FROM mdm.aa_job_limit WHERE tenant_id = :t ORDER BY id",
    }
    with engine.connect() as conn:
        return {name: [tuple(r) for r in conn.execute(text(sql), {"t": b.tenant})]
                for name, sql in queries.items()}


def _assert_clean(b: B, response: httpx.Response, what: str,
                  known: frozenset[str] = frozenset()) -> None:
    """Nothing of B's in the answer, except what A's own request carried (an id or a name
    echoed in "no job <id>" is A's input, not B's data)."""
    sent = str(response.request.url) + response.request.content.decode("utf-8", "replace")
    sent = sent + unquote_plus(sent)
    for secret in b.secrets():
        if secret in sent or secret in known:
            continue
        assert secret not in response.text, f"{what}: tenant B's {secret!r} in the answer"
        assert secret not in response.headers.get("location", ""), (
            f"{what}: tenant B's {secret!r} in the redirect")


def test_tenant_a_reaches_nothing_of_tenant_b_on_any_route(dash_url, engine, tenant, a_rows,
                                                           b_rows):
    key = tenant_key(engine, "acme-walk", tenant)
    before = b_snapshot(engine, b_rows)
    with httpx.Client(base_url=dash_url, headers={"apikey": key}, timeout=30) as api, \
            httpx.Client(base_url=dash_url, timeout=30) as dash:
        sign_in(dash, key)
        walk = Walk(api, dash, dash_url, key, a_rows, b_rows)
        covered = set()
        for (method, path), probe in sorted(WALK.items()):
            for response, allowed, *known in probe(walk):
                what = f"{method} {path} -> {response.request.method} {response.request.url}"
                assert response.status_code in allowed, (
                    f"{what}: {response.status_code} (allowed {allowed}): {response.text[:300]}")
                _assert_clean(b_rows, response, what, frozenset(*known))
                if response.status_code in REFUSED | {400}:
                    assert response.status_code != 500
            covered.add((method, path))
        assert dash.get("/dashboard/").status_code == 200  # the walk's session survived
    assert covered == WALK.keys()
    assert b_snapshot(engine, b_rows) == before, "a route changed tenant B's rows"


def test_the_walk_would_see_b_if_a_route_leaked(dash_url, engine, b_rows):
    """The walk's own check: the service role, which may see B, does see B's marks."""
    with httpx.Client(base_url=dash_url, headers={"apikey": SERVICE_KEY}, timeout=30) as api:
        answer = api.get(f"/v1/functions/jobs/{b_rows.dead_job}")
        assert answer.status_code == 200
        with pytest.raises(AssertionError, match="tenant B's"):
            _assert_clean(b_rows, answer, "service role")
    with httpx.Client(base_url=dash_url, timeout=30) as dash:
        sign_in(dash, SERVICE_KEY)
        page = dash.get(f"/dashboard/emails/{b_rows.email_log}")
        assert page.status_code == 200 and MARK in page.text
        assert re.search(re.escape(MARK), dash.get("/dashboard/cron").text)
