"""The tenant walk: every route of the served application — the HTTP API and every page and
form of the dashboard — exercised with tenant A's credentials against tenant B's ids, over
real HTTP. Each answer must be a refusal (403/404, or 400 where A names B's tenant in a
field) or A's own data, with nothing of B's in the body; afterwards B's rows must be
exactly as they were.

The walk table (`WALK`, tests/dashboard/tenant_walk.py) is checked against `app.routes`
first: a route that the table does not cover fails the test, so a new route cannot forget
its tenant scoping.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from sqlalchemy import Engine, text
from starlette.routing import Mount, Route

from postrelay.core.db import Database, sqlalchemy_url
from postrelay.core.settings import Settings
from postrelay.queue import limit_set, pause
from postrelay.queue.cron import cron_create
from postrelay.relay import webhook_add, webhook_disable
from postrelay.web import create_web_app
from tests.dashboard.conftest import SERVICE_KEY, insert_email, insert_event, sign_in, tenant_key
from tests.dashboard.tenant_walk import (
    B_CRON,
    B_KEY,
    B_RECIPIENT,
    MARK,
    REFUSED,
    WALK,
    A,
    B,
    Walk,
    assert_clean,
)
from tests.factories import insert_attempt, insert_job


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
        webhook, webhook_secret = webhook_add(conn, other_tenant,
                                              f"https://{MARK}.example/hooks",
                                              event_types=[f"{MARK}.*"])
        webhook_disable(conn, webhook.id, reason=MARK)
        insert_attempt(conn, webhook.id, event_id=handled_event, response_body=MARK,
                       error=MARK)
    return B(other_tenant, dead, done, pending, log, dead_event, handled_event,
             B_CRON, B_KEY, webhook.id, webhook_secret)


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
        webhook_add(conn, tenant, "https://hooks.acme.example/")
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
        "webhooks": "SELECT id, url, enabled, disabled_reason, secret, updated_at "
                    "FROM mdm.aa_webhook_endpoint WHERE tenant_id = :t ORDER BY id",
        "attempts": "SELECT a.id FROM mdm.aa_webhook_attempt a JOIN mdm.aa_webhook_endpoint w "
                    "ON w.id = a.endpoint_id WHERE w.tenant_id = :t ORDER BY a.id",
    }
    with engine.connect() as conn:
        return {name: [tuple(r) for r in conn.execute(text(sql), {"t": b.tenant})]
                for name, sql in queries.items()}


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
                assert_clean(b_rows, response, what, frozenset(*known))
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
            assert_clean(b_rows, answer, "service role")
    with httpx.Client(base_url=dash_url, timeout=30) as dash:
        sign_in(dash, SERVICE_KEY)
        page = dash.get(f"/dashboard/emails/{b_rows.email_log}")
        assert page.status_code == 200 and MARK in page.text
        assert re.search(re.escape(MARK), dash.get("/dashboard/cron").text)
