"""The dashboard served for real (uvicorn on loopback, mounted beside the API by create_web_app) on
the test run's database, signed-in HTTP clients, and a headless Chromium driven by
Playwright for the end-to-end tests.

Screenshots go to $POSTRELAY_TEST_ARTIFACTS, else tests/dashboard/artifacts/.
"""

from __future__ import annotations

import html
import json
import os
import re
import secrets
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text

from postrelay.access.keys import api_key_create
from postrelay.queue import ensure_tenant
from tests.api.server import UNTHROTTLED, serve_database
from tests.factories import insert_job

SERVICE_KEY = "svc-" + secrets.token_urlsafe(24)
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(os.environ.get("POSTRELAY_TEST_ARTIFACTS")
                 or Path(__file__).resolve().parent / "artifacts")


@pytest.fixture(scope="session")
def email_templates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `welcome` template with an HTML part that would run a script if it were trusted."""
    root = tmp_path_factory.mktemp("email-templates")
    (root / "welcome").mkdir()
    (root / "welcome" / "subject.txt").write_text("Welcome to Acme, {{ user.name }}")
    (root / "welcome" / "body.txt").write_text("Hi {{ user.name }},\n\nyour {{ plan }} plan "
                                               "is ready.\n")
    (root / "welcome" / "body.html").write_text(
        '<h1 style="color:#4f46e5">Hi {{ user.name }}</h1><p>Your {{ plan }} plan is ready.</p>'
        "<script>parent.document.title = 'pwned'</script>")
    return root


@pytest.fixture(scope="session")
def dash_url(database_url: str, email_templates: Path) -> Iterator[str]:
    """The API's base URL; the dashboard is at {dash_url}/dashboard."""
    with serve_database(database_url, SERVICE_KEY, email_templates_dir=email_templates,
                        **UNTHROTTLED) as url:
        yield url


@pytest.fixture
def anonymous(dash_url: str, clean_db: None) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=dash_url, timeout=30) as client:
        yield client


@pytest.fixture
def admin(dash_url: str, clean_db: None) -> Iterator[httpx.Client]:
    """Signed in with the service-role key."""
    with httpx.Client(base_url=dash_url, timeout=30) as client:
        sign_in(client, SERVICE_KEY)
        yield client


@pytest.fixture
def other_tenant(engine: Engine, tenant: uuid.UUID) -> uuid.UUID:
    with engine.begin() as conn:
        return ensure_tenant(conn, "globex")  # type: ignore[return-value]


@pytest.fixture
def acme_key(engine: Engine, tenant: uuid.UUID) -> str:
    return tenant_key(engine, "acme-dash", tenant)


@pytest.fixture
def acme(dash_url: str, acme_key: str) -> Iterator[httpx.Client]:
    """Signed in with a key of the `tenant` fixture's tenant (acme)."""
    with httpx.Client(base_url=dash_url, timeout=30) as client:
        sign_in(client, acme_key)
        yield client


def tenant_key(engine: Engine, name: str, tenant_id: uuid.UUID) -> str:
    with engine.begin() as conn:
        _, key = api_key_create(conn, name, tenant_id=tenant_id, actor="test:ops")
    return key


def login_token(client: httpx.Client) -> str:
    page = client.get("/dashboard/login")
    assert page.status_code == 200, page.text
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, page.text
    return found.group(1)


def sign_in(client: httpx.Client, key: str) -> httpx.Response:
    response = client.post("/dashboard/login",
                           data={"csrf": login_token(client), "key": key, "next": "/"})
    assert response.status_code == 303, response.text
    return response


def csrf_of(client: httpx.Client, path: str = "/dashboard/") -> str:
    """The session's CSRF token, as a page's forms carry it."""
    page = client.get(path)
    assert page.status_code == 200, page.text
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, page.text
    return found.group(1)


def form_fields(page: str, action: str) -> dict[str, list[str]]:
    """The hidden fields of the page's form that posts to `action` (a path's end), repeated
    ones kept in order, as the browser submits them."""
    found = re.search(rf'<form method="post" action="[^"]*{re.escape(action)}"[^>]*>(.*?)</form>',
                      page, re.S)
    assert found, page
    fields: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)">',
                                  found.group(1)):
        fields.setdefault(html.unescape(name), []).append(html.unescape(value))
    return fields


def insert_event(conn: Any, tenant_id: uuid.UUID, **fields: Any) -> uuid.UUID:
    values = {"aggregate_type": "order", "aggregate_id": "42", "event_type": "order.placed",
              "payload": {"order": 42}, "dead_at": None, "last_error": None, "attempts": 0,
              "handled_at": None, "created_at": None, **fields}
    return conn.execute(text(
        "INSERT INTO mdm.aa_outbox_event (tenant_id, aggregate_type, aggregate_id, event_type,"
        " payload, dead_at, last_error, attempts, handled_at, created_at)"
        " VALUES (:tenant_id, :aggregate_type, :aggregate_id, :event_type,"
        " CAST(:payload AS jsonb), :dead_at, :last_error, :attempts, :handled_at,"
        " COALESCE(:created_at, now())) RETURNING id"),
        {**values, "tenant_id": tenant_id, "payload": json.dumps(values["payload"])},
    ).scalar_one()


def insert_email(conn: Any, tenant_id: uuid.UUID, **fields: Any) -> uuid.UUID:
    job_id = fields.pop("job_id", None) or uuid.uuid4()  # every attempt is some job's
    values = {"job_id": job_id, "event_id": None, "template": "welcome",
              "from_address": "noreply@example.com", "recipients": ["ann@example.com"],
              "subject": "Welcome, Ann", "message_id": f"<{job_id}@test>",
              "status": "sent", "smtp_code": 250, "smtp_enhanced": "2.0.0",
              "smtp_response": "Ok: queued as 4BC1", "error": None, "attempt": 1,
              "created_at": None, "recipient_results": None, "template_version": None,
              **fields}
    values["recipient_results"] = (json.dumps(values["recipient_results"])
                                   if values["recipient_results"] is not None else None)
    return conn.execute(text(
        "INSERT INTO mdm.aa_email_log (tenant_id, job_id, event_id, template, from_address,"
        " recipients, to_addresses, subject, message_id, status, smtp_code, smtp_enhanced,"
        " smtp_response, error, attempt, created_at, finished_at, recipient_results,"
        " template_version)"
        " VALUES (:tenant_id, :job_id, :event_id, :template, :from_address, :recipients,"
        " :recipients, :subject, :message_id, :status, :smtp_code, :smtp_enhanced,"
        " :smtp_response, :error, :attempt, COALESCE(:created_at, now()),"
        " COALESCE(:created_at, now()) + interval '80 ms', CAST(:recipient_results AS jsonb),"
        " :template_version)"
        " RETURNING id"),
        {**values, "tenant_id": tenant_id},
    ).scalar_one()


# --- the browser -----------------------------------------------------------------------


# Module scope: Playwright's sync API runs an event loop in this thread while it is open,
# and the async tests of later modules need the thread's loop slot free.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip("end-to-end tests need Debian's chromium at /usr/bin/chromium "
                    "(apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any, dash_url: str, clean_db: None) -> Iterator[Any]:
    """A fresh browser context (no cookies) whose page fails the test on a script error
    or a Content-Security-Policy violation."""
    context = browser.new_context(base_url=dash_url, viewport={"width": 1440, "height": 900})
    context.set_default_timeout(10_000)
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    # Error answers (a 401 for a wrong key, a 400 for a bad form) are logged by the browser
    # as failed loads; anything else on the console (a CSP violation) is a problem.
    tab.on("console", lambda msg: problems.append(f"console {msg.type}: {msg.text}")
           if msg.type == "error" and not msg.text.startswith("Failed to load resource")
           else None)
    tab.problems = problems
    yield tab
    context.close()


def browser_sign_in(page: Any, key: str = SERVICE_KEY) -> None:
    page.goto("/dashboard/")
    page.fill("input[name=key]", key)
    page.click("button[type=submit]")
    page.wait_for_url("**/dashboard/")


def shot(page: Any, name: str) -> Path:
    """Save a full-page screenshot as a test artefact."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


# --- shared by the HTTP tests ----------------------------------------------------------

PAGES = ["/dashboard/", "/dashboard/panels", "/dashboard/jobs", "/dashboard/jobs?status=done",
         "/dashboard/jobs?status=pending", "/dashboard/jobs?status=dlq", "/dashboard/dlq",
         "/dashboard/cron", "/dashboard/outbox", "/dashboard/emails"]


def dead(engine, tenant_id, *, ago: float = 60.0, **fields) -> uuid.UUID:
    fields = {"attempts": 3, "max_attempts": 3, "last_error": "boom", **fields}
    with engine.begin() as conn:
        return insert_job(conn, tenant_id=tenant_id, status="dlq",
                          completed_at=datetime.now(UTC) - timedelta(seconds=ago), **fields)
