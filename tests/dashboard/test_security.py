"""The dashboard's defences over plain HTTP: sign-in and sign-out, the session cookie,
security headers, CSRF on every mutation, and tenant scoping."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import httpx
from sqlalchemy import text

from postrelay.access.keys import api_key_revoke
from postrelay.queue.cron import cron_create
from tests.dashboard.conftest import (
    PAGES,
    SERVICE_KEY,
    csrf_of,
    dead,
    insert_email,
    insert_event,
    login_token,
    sign_in,
    tenant_key,
)
from tests.factories import audit_rows, insert_job, job_row


def cookies_set(response: httpx.Response) -> list[str]:
    return [c.split("=", 1)[0] for c in response.headers.get_list("set-cookie")]


# --- signing in and out ------------------------------------------------------------------

def test_pages_need_a_session(anonymous):
    for path in PAGES:
        response = anonymous.get(path)
        assert response.status_code == 303, path
        assert response.headers["location"].startswith("/dashboard/login"), path
    assert anonymous.get("/dashboard/jobs?status=dlq").headers["location"] == (
        "/dashboard/login?next=%2Fjobs%3Fstatus%3Ddlq")
    # The overview's script asks for fragments; it gets a 401 to act on, not a redirect.
    assert anonymous.get("/dashboard/panels",
                         headers={"x-dashboard-fragment": "1"}).status_code == 401

def test_service_key_signs_in_with_a_strict_httponly_cookie_without_the_key(anonymous):
    response = sign_in(anonymous, SERVICE_KEY)
    assert response.headers["location"] == "/dashboard/"
    cookie = next(c for c in response.headers.get_list("set-cookie")
                  if c.startswith("postrelay_dashboard="))
    attributes = {a.strip().lower() for a in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/dashboard"} <= attributes
    assert SERVICE_KEY not in cookie
    page = anonymous.get("/dashboard/")
    assert page.status_code == 200 and "Service role" in page.text

def test_the_cookie_is_secure_behind_a_tls_proxy(anonymous):
    response = anonymous.post("/dashboard/login", headers={"x-forwarded-proto": "https"},
                              data={"csrf": login_token(anonymous), "key": SERVICE_KEY})
    cookie = next(c for c in response.headers.get_list("set-cookie")
                  if c.startswith("postrelay_dashboard="))
    assert "secure" in {a.strip().lower() for a in cookie.split(";")[1:]}

def test_wrong_key_and_stale_form_are_refused(anonymous, tenant):
    for key in ("wrong", SERVICE_KEY + "x", "", " "):
        response = anonymous.post("/dashboard/login",
                                  data={"csrf": login_token(anonymous), "key": key})
        assert response.status_code == 401, key
        assert "not valid" in response.text
        assert "postrelay_dashboard" not in cookies_set(response)
    # Without the sign-in form's token (another site posting the form): refused.
    with httpx.Client(base_url=str(anonymous.base_url)) as fresh:
        response = fresh.post("/dashboard/login", data={"csrf": "x", "key": SERVICE_KEY})
        assert response.status_code == 400 and "expired" in response.text
        assert fresh.get("/dashboard/").status_code == 303

def test_next_only_goes_to_dashboard_paths(anonymous):
    for target, expected in [("/jobs?status=dlq", "/dashboard/jobs?status=dlq"),
                             ("//evil.example/x", "/dashboard/"),
                             ("https://evil.example/", "/dashboard/"),
                             ("/\\evil.example", "/dashboard/")]:
        with httpx.Client(base_url=str(anonymous.base_url)) as client:
            response = client.post("/dashboard/login", data={
                "csrf": login_token(client), "key": SERVICE_KEY, "next": target})
            assert response.headers["location"] == expected, target

def test_sign_out_ends_the_session(admin):
    response = admin.post("/dashboard/logout", data={"csrf": csrf_of(admin)})
    assert response.status_code == 303 and response.headers["location"] == "/dashboard/login"
    assert admin.get("/dashboard/").status_code == 303

def test_forged_or_tampered_cookies_are_refused(admin, dash_url):
    cookie = admin.cookies.get("postrelay_dashboard")
    version, payload, mac = cookie.split(".")
    flip = "B" if mac[-1] == "A" else "A"
    for bad in (f"{version}.{payload}.{mac[:-1]}{flip}", f"{version}.{payload}x.{mac}",
                "v1.e30.AAAA", "garbage"):
        with httpx.Client(base_url=dash_url, cookies={"postrelay_dashboard": bad}) as client:
            assert client.get("/dashboard/").status_code == 303, bad


def test_non_ascii_tokens_and_cookies_are_refused_not_a_500(admin, anonymous, dash_url):
    for token in ("ü", "\ufffd", csrf_of(admin) + "é"):
        refused = admin.post("/dashboard/logout", data={"csrf": token})
        assert refused.status_code == 403, (token, refused.text[:300])
        stale = anonymous.post("/dashboard/login", data={"csrf": token, "key": SERVICE_KEY})
        assert stale.status_code == 400 and "expired" in stale.text, token
    version, payload, _ = admin.cookies.get("postrelay_dashboard").split(".")
    forged = f"postrelay_dashboard={version}.{payload}.\xe9".encode("latin-1")
    with httpx.Client(base_url=dash_url, headers={"cookie": forged}) as client:
        assert client.get("/dashboard/").status_code == 303
    assert admin.get("/dashboard/").status_code == 200  # still signed in

def test_a_revoked_tenant_key_ends_its_session_at_once(acme, engine):
    assert acme.get("/dashboard/").status_code == 200
    with engine.begin() as conn:
        api_key_revoke(conn, "acme-dash", actor="test:ops")
    assert acme.get("/dashboard/").status_code == 303
    response = acme.post("/dashboard/login", data={"csrf": login_token(acme), "key": "x"})
    assert response.status_code == 401


# --- security headers and CSRF -----------------------------------------------------------

def test_every_response_carries_the_security_headers(admin):
    for path in [*PAGES, "/dashboard/login", "/dashboard/static/dashboard.css",
                 "/dashboard/static/dashboard.js", "/dashboard/nope",
                 f"/dashboard/jobs/{uuid.uuid4()}"]:
        response = admin.get(path)
        assert response.status_code in (200, 303, 404), path  # signed in: login redirects
        csp = response.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
        assert "script-src 'self'" in csp and "style-src 'self'" in csp, path
        assert "unsafe-inline" not in csp, path
        assert response.headers["x-frame-options"] == "DENY", path
        assert response.headers["referrer-policy"] == "no-referrer", path
        assert response.headers["x-content-type-options"] == "nosniff", path
    assert admin.get("/dashboard/").headers["cache-control"] == "no-store"

def test_pages_have_no_inline_script_or_style(admin, engine, tenant):
    dead(engine, tenant)
    for path in PAGES:
        body = admin.get(path).text
        assert "<script>" not in body and " style=" not in body and "<style" not in body, path
        assert " on" + "click=" not in body, path

def test_every_mutation_needs_the_sessions_csrf_token(admin, acme, engine, tenant):
    job = dead(engine, tenant)
    with engine.begin() as conn:
        cron_create(conn, "nightly", "0 3 * * *", "reindex", {}, tenant_id=tenant)
    acme_token = csrf_of(acme)
    forms = [
        ("/dashboard/dlq/apply", {"action": "retry", "ids": str(job)}),
        ("/dashboard/dlq/confirm", {"action": "retry", "ids": str(job)}),
        ("/dashboard/cron", {"name": "x", "schedule": "* * * * *", "kind": "reindex"}),
        ("/dashboard/cron/nightly/delete", {}),
        ("/dashboard/outbox/replay", {"event_id": str(uuid.uuid4())}),
        ("/dashboard/logout", {}),
    ]
    for path, form in forms:
        for token in (None, "", "forged", acme_token):  # another session's token too
            data = dict(form) if token is None else {**form, "csrf": token}
            response = admin.post(path, data=data)
            assert response.status_code == 403, (path, token)
            assert "security token" in response.text
        response = admin.post(path, data={**form, "csrf": csrf_of(admin)},
                              headers={"sec-fetch-site": "cross-site"})
        assert response.status_code == 403, path
    with engine.connect() as conn:
        assert job_row(conn, job)["state"] == "dlq"
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_cron_entry "
                                 "WHERE name = 'nightly'")).scalar() == 1
    assert admin.get("/dashboard/").status_code == 200  # still signed in


# --- pages and filters -------------------------------------------------------------------

def test_a_tenant_key_sees_only_its_tenant(acme, engine, tenant, other_tenant):
    with engine.begin() as conn:
        mine = insert_job(conn, tenant_id=tenant, status="done",
                          completed_at=datetime.now(UTC))
        theirs = insert_job(conn, tenant_id=other_tenant, status="done",
                            completed_at=datetime.now(UTC))
        their_email = insert_email(conn, other_tenant, subject="Globex secret")
        my_email = insert_email(conn, tenant, subject="Acme hello")
        insert_event(conn, other_tenant, dead_at=datetime.now(UTC), last_error="globex err")
    overview = acme.get("/dashboard/").text
    assert 'data-count="status-done">1<' in overview and "globex" not in overview
    # Asking for the other tenant by id changes nothing: the session's tenant wins.
    listed = acme.get("/dashboard/jobs", params={"status": "done",
                                                 "tenant": str(other_tenant)}).text
    assert str(mine) in listed and str(theirs) not in listed
    assert acme.get(f"/dashboard/jobs/{theirs}").status_code == 404
    assert acme.get(f"/dashboard/emails/{their_email}").status_code == 404
    emails = acme.get("/dashboard/emails").text
    assert "Acme hello" in emails and "Globex secret" not in emails
    assert acme.get(f"/dashboard/emails/{my_email}").status_code == 200
    assert "globex err" not in acme.get("/dashboard/outbox").text

def test_a_tenant_key_cannot_act_on_another_tenants_jobs_or_cron(acme, engine, tenant,
                                                                  other_tenant):
    theirs = dead(engine, other_tenant)
    mine = dead(engine, tenant)
    with engine.begin() as conn:
        cron_create(conn, "globex-nightly", "0 3 * * *", "reindex", {}, tenant_id=other_tenant)
    token = csrf_of(acme)
    for action, ids in (("retry", [str(theirs), str(mine)]), ("discard", [str(theirs)])):
        response = acme.post("/dashboard/dlq/apply",
                             data={"csrf": token, "action": action, "ids": ids})
        assert response.status_code == 303
    with engine.connect() as conn:
        assert job_row(conn, theirs)["state"] == "dlq" and audit_rows(conn, theirs) == []
        assert job_row(conn, mine)["state"] == "pending"
        (audit,) = audit_rows(conn, mine)
    assert audit["actor"] == "dashboard:key:acme-dash"
    # "All matching this filter" for another tenant's id also stays inside the session's.
    response = acme.post("/dashboard/dlq/apply", data={
        "csrf": token, "action": "retry", "scope": "matching", "tenant": str(other_tenant)})
    assert response.status_code == 303
    assert acme.post("/dashboard/cron/globex-nightly/delete",
                     data={"csrf": token}).status_code == 404
    with engine.connect() as conn:
        assert job_row(conn, theirs)["state"] == "dlq"
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_cron_entry "
                                 "WHERE name = 'globex-nightly'")).scalar() == 1


# --- actions -----------------------------------------------------------------------------

def test_a_tenant_session_names_its_tenant_and_key(engine, tenant, dash_url, clean_db):
    key = tenant_key(engine, "second", tenant)
    with httpx.Client(base_url=dash_url) as client:
        sign_in(client, key)
        page = client.get("/dashboard/").text
    assert "acme" in page and "key second" in page and "Service role" not in page
