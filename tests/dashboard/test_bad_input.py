"""Every dashboard filter and form field, fed what PostgreSQL refuses (NUL) and other
hostile values: a 400 page naming the field, never a 500 or a logged traceback (issue 18).

The query parameters are read from the dashboard's own routes and the form fields from its
rendered forms, so a new filter or field is covered without editing this file."""

from __future__ import annotations

import logging
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi.routing import APIRoute

from postrelay.core.db import Database, sqlalchemy_url
from postrelay.core.settings import Settings
from postrelay.dashboard import create_dashboard
from postrelay.queue.cron import cron_create
from tests.dashboard.conftest import SERVICE_KEY, dead, insert_email, insert_event, login_token

HOSTILE = ["a\x00b", "%", "\\", "'", '"', "x" * 5000, "-1", "99999999999999999999",
           "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "2024-13-45T99:99",
           "\u202e", "😀", "\ufffd"]
RAW_HOSTILE = ["%ED%A0%80", "%FF", "%C0%AF", "%00%00", "%2500"]  # sent as written


@pytest.fixture
def seeded(engine, tenant) -> dict[str, str]:
    """A job, an email, an event and a cron entry, for the pages that show one."""
    job = dead(engine, tenant, idempotency_key="order-7")
    with engine.begin() as conn:
        email = insert_email(conn, tenant, job_id=job)
        insert_event(conn, tenant, dead_at="2024-01-01T00:00:00+00:00", last_error="boom")
        cron_create(conn, "nightly", "0 3 * * *", "reindex", {}, tenant_id=tenant)
    return {"job_id": str(job), "log_id": str(email), "name": "nightly"}


def dashboard_routes(database_url: str) -> list[APIRoute]:
    db = Database(url=sqlalchemy_url(database_url))
    app = create_dashboard(Settings(database_url=database_url, service_role_key=SERVICE_KEY),
                           db)
    db.close()
    return list(_api_routes(app.routes))


def _api_routes(routes: list[Any]) -> Any:
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif hasattr(route, "original_router"):  # an included router, in newer FastAPI
            yield from _api_routes(route.original_router.routes)


def query_parameters(route: APIRoute) -> list[str]:
    """The query parameters of the route and of every dependency it has."""
    found: list[str] = []
    todo = [route.dependant]
    while todo:
        dependant = todo.pop()
        found += [p.alias for p in dependant.query_params if p.alias not in found]
        todo += dependant.dependencies
    return found


def no_logged_errors(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []


def test_nul_in_every_query_parameter_of_every_page_is_a_400_naming_it(
        admin, seeded, database_url, caplog):
    routes = [r for r in dashboard_routes(database_url) if "GET" in r.methods]
    checked = []
    for route in routes:
        path = "/dashboard" + route.path.format(**seeded)
        for name in query_parameters(route):
            response = admin.get(path, params={name: "\x00"})
            assert response.status_code == 400, (path, name, response.text[:300])
            assert "Bad request" in response.text and f"{name}: must not contain NUL" in \
                response.text, (path, name)
            checked.append((route.path, name))
        # An undeclared parameter is refused the same way (it could reach a page later).
        assert admin.get(path, params={"other": "x\x00"}).status_code == 400, path
    # The walk saw the filters of the issue, and the others.
    assert {("/jobs", "q"), ("/emails", "recipient"), ("/emails", "template"),
            ("/jobs", "kind"), ("/dlq", "tenant"), ("/emails", "since")} <= set(checked)
    no_logged_errors(caplog)


def test_hostile_values_in_every_query_parameter_are_never_a_500(admin, seeded, database_url,
                                                                caplog):
    for route in [r for r in dashboard_routes(database_url) if "GET" in r.methods]:
        path = "/dashboard" + route.path.format(**seeded)
        for name in query_parameters(route):
            for value in HOSTILE:
                response = admin.get(path, params={name: value})
                assert response.status_code < 500, (path, name, value)
            for raw in RAW_HOSTILE:
                response = admin.get(f"{path}?{name}={raw}")
                assert response.status_code < 500, (path, name, raw)
    # Path segments too: a NUL or junk where an id goes is a 404, never a 500.
    for path in ["/dashboard/jobs/%00", "/dashboard/emails/%00", "/dashboard/emails/%00/preview",
                 "/dashboard/jobs/%FF", "/dashboard/emails/" + "x" * 3000]:
        assert admin.get(path).status_code == 404, path
    no_logged_errors(caplog)


# --- forms -----------------------------------------------------------------------------


class Forms(HTMLParser):
    """The POST forms of a page: action and fields (name -> the value the page gives)."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[dict[str, Any]] = []
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form" and a.get("method", "get").lower() == "post":
            self.forms.append({"action": a.get("action", ""), "fields": {}})
        elif not self.forms or "name" not in a:
            if tag == "option" and self._select and self.forms:
                fields = self.forms[-1]["fields"]
                if not fields.get(self._select) or "selected" in a:
                    fields[self._select] = a.get("value", "")
            return
        elif tag == "input":
            if a.get("type") in ("checkbox", "radio") and "checked" not in a:
                self.forms[-1]["fields"].setdefault(a["name"], a.get("value", "on"))
            else:
                self.forms[-1]["fields"][a["name"]] = a.get("value", "")
        elif tag in ("select", "textarea", "button"):
            self.forms[-1]["fields"].setdefault(a["name"], a.get("value", ""))
            self._select = a["name"] if tag == "select" else None
            self._textarea = a["name"] if tag == "textarea" else None

    def handle_data(self, data: str) -> None:
        if self._textarea and self.forms:
            self.forms[-1]["fields"][self._textarea] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        if tag == "textarea":
            self._textarea = None


def post_forms(client: httpx.Client, page: httpx.Response) -> list[dict[str, Any]]:
    parser = Forms()
    parser.feed(page.text)
    return [f for f in parser.forms if f["action"]]


def test_nul_in_every_form_field_is_a_400_naming_it(admin, anonymous, seeded, engine, caplog):
    pages = ["/dashboard/", "/dashboard/jobs?status=dlq", f"/dashboard/jobs/{seeded['job_id']}",
             "/dashboard/dlq", "/dashboard/cron", "/dashboard/outbox", "/dashboard/emails"]
    forms = []
    for path in pages:
        forms += [(admin, f) for f in post_forms(admin, admin.get(path))]
    # The confirmation step of the DLQ, whose form is only a POST away.
    confirm = admin.post("/dashboard/dlq/confirm", data={
        "csrf": forms[0][1]["fields"]["csrf"], "action": "retry", "ids": seeded["job_id"]})
    assert confirm.status_code == 200, confirm.text
    forms += [(admin, f) for f in post_forms(admin, confirm)]
    forms += [(anonymous, f) for f in post_forms(anonymous, anonymous.get("/dashboard/login"))]
    actions = {urlsplit(f["action"]).path for _, f in forms}
    assert {"/dashboard/cron", "/dashboard/cron/nightly/delete", "/dashboard/dlq/confirm",
            "/dashboard/dlq/apply", "/dashboard/outbox/replay", "/dashboard/login",
            "/dashboard/logout"} <= actions, actions
    checked = 0
    for client, form in forms:
        for name in form["fields"]:
            fields = dict(form["fields"])
            if client is anonymous:
                fields["csrf"] = login_token(anonymous)
            fields[name] = "x\x00y"
            response = client.post(form["action"], data=fields, follow_redirects=False)
            assert response.status_code == 400, (form["action"], name, response.text[:300])
            assert f"{name}: must not contain NUL" in response.text, (form["action"], name)
            checked += 1
    assert checked >= 20
    # Nothing was done: the entry and the job are as they were, the admin still signed in.
    assert admin.get("/dashboard/cron").text.count("nightly") >= 1
    assert admin.get("/dashboard/dlq").status_code == 200
    assert seeded["job_id"] in admin.get("/dashboard/dlq").text
    no_logged_errors(caplog)

