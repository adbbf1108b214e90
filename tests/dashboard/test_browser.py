"""End to end in a real headless Chromium: sign in, read the overview against the database,
retry a dead job by clicking, delete a cron entry, open an email's story, and check that
hostile payloads stay inert. Every page is saved as a screenshot (see conftest.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from postrelay.queue.cron import cron_create
from tests.dashboard.conftest import (
    SERVICE_KEY,
    browser_sign_in,
    insert_email,
    insert_event,
    shot,
    tenant_key,
)
from tests.factories import audit_rows, insert_job, job_row

XSS = "<script>window.__pwned = 1; document.title = 'pwned'</script>"
XSS_IMG = '<img src=x onerror="window.__pwned = 2; document.title = \'pwned\'">'


def fill(engine, tenant, other_tenant) -> None:
    """A little of everything, so that every page has something to show."""
    now = datetime.now(UTC)
    with engine.begin() as conn:
        for minutes_ago in range(0, 58, 3):
            for n in range(1 + minutes_ago % 7):
                insert_job(conn, tenant_id=tenant if n % 3 else other_tenant,
                           kind=("reindex", "email_send", "bulk_import")[n % 3], status="done",
                           completed_at=now - timedelta(minutes=minutes_ago, seconds=n))
            if minutes_ago % 9 == 0:
                insert_job(conn, tenant_id=tenant, kind="virus_scan", status="failed",
                           completed_at=now - timedelta(minutes=minutes_ago),
                           last_error="StopJob: file is encrypted")
        for n in range(4):
            insert_job(conn, tenant_id=tenant, kind="reindex", payload={"order": n},
                       available_at=now - timedelta(seconds=40 * n))
        insert_job(conn, tenant_id=other_tenant, kind="bulk_import", status="running",
                   claimed_by="worker-1@host", claimed_at=now - timedelta(seconds=12))
        insert_event(conn, tenant, dead_at=now, attempts=10,
                     last_error="KeyError: 'customer'\n  File \"routes.py\", line 12")
        insert_event(conn, tenant)
        insert_email(conn, tenant, subject="Your receipt #1042")
        insert_email(conn, other_tenant, status="bounced", smtp_code=550,
                     smtp_enhanced="5.1.1", smtp_response="No such user",
                     recipients=["ghost@example.org"], template="receipt")
        cron_create(conn, "nightly-report", "0 3 * * *", "bulk_import", {"dryRun": False},
                    tenant_id=tenant)


def counts_in_database(engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT status::text, count(*) FROM mdm.aa_job GROUP BY 1")).all()
    return {"pending": 0, "running": 0, "done": 0, "failed": 0, "dlq": 0, **dict(rows)}


def test_sign_in_overview_matches_the_database_and_refreshes_itself(page, engine, tenant,
                                                                   other_tenant):
    fill(engine, tenant, other_tenant)
    page.goto("/dashboard/")
    assert page.url.endswith("/dashboard/login")
    shot(page, "01-sign-in")
    page.fill("input[name=key]", "not the key")
    page.click("button[type=submit]")
    assert "not valid" in page.inner_text(".alert")
    browser_sign_in(page)
    expected = counts_in_database(engine)
    for status, count in expected.items():
        assert page.inner_text(f"[data-count=status-{status}]") == f"{count:,}", status
    assert page.inner_text("[data-count=running]") == "1"
    assert page.inner_text("[data-count=due]") == "4"
    assert page.inner_text("[data-count=chart-failed]") == "7"
    assert page.inner_text("[data-count=outbox-dead]") == "1"
    assert page.inner_text("[data-count=email-bounced]") == "1"
    assert page.locator("svg.chart rect.bar-done").count() > 10
    shot(page, "02-overview")
    # The panels refresh without a reload: a new dead job shows up by itself.
    page.evaluate("window.__notReloaded = true")
    with engine.begin() as conn:
        insert_job(conn, tenant_id=tenant, status="dlq", completed_at=datetime.now(UTC))
    page.locator("[data-count=dlq]").filter(has_text="1").wait_for(timeout=12_000)
    assert page.evaluate("window.__notReloaded") is True
    assert "updated" in page.inner_text("#live-text")
    assert page.problems == []


def test_retry_a_dead_job_by_clicking_and_watch_it_leave(page, engine, tenant):
    with engine.begin() as conn:
        leaving = insert_job(conn, tenant_id=tenant, kind="email_send", status="dlq",
                             attempts=8, completed_at=datetime.now(UTC),
                             last_error="SMTPRecipientsRefused: 550 5.1.1 no such user")
        staying = insert_job(conn, tenant_id=tenant, kind="reindex", status="dlq",
                             attempts=8, completed_at=datetime.now(UTC) - timedelta(hours=1),
                             last_error="TimeoutError: search cluster did not answer")
    browser_sign_in(page)
    page.click("nav.side >> text=Dead letters")
    # The click returns once the page has begun to load; dashboard.js (deferred) disables the
    # buttons that need a selection before DOMContentLoaded.
    page.wait_for_load_state("domcontentloaded")
    assert page.inner_text("[data-count=dlq-total]") == "2"
    retry = page.locator("button[value=retry]")
    assert retry.is_disabled()  # nothing selected yet
    page.check(f"tr[data-job='{leaving}'] input[name=ids]")
    assert page.inner_text("#selected-count") == "1 selected"
    shot(page, "05-dlq")
    retry.click()
    assert "Retry 1 job?" in page.inner_text("h1")
    shot(page, "06-dlq-confirm")
    page.click("#confirm")
    page.wait_for_url("**/dashboard/dlq?*")
    assert "1 job retried." in page.inner_text(".alert.ok")
    assert page.locator(f"tr[data-job='{leaving}']").count() == 0
    assert page.locator(f"tr[data-job='{staying}']").count() == 1
    assert page.inner_text("[data-count=dlq-total]") == "1"
    with engine.connect() as conn:
        assert job_row(conn, leaving)["state"] == "pending"
        (audit,) = audit_rows(conn, leaving)
    assert (audit["action"], audit["actor"]) == ("job_retry", "dashboard:service-role")
    # The job's own page tells the same story.
    page.goto(f"/dashboard/jobs/{leaving}")
    assert "job_retry" in page.inner_text("table")
    shot(page, "04-job")
    assert page.problems == []


def test_delete_a_cron_entry(page, engine, tenant):
    with engine.begin() as conn:
        cron_create(conn, "nightly-report", "0 3 * * *", "bulk_import", {"dryRun": False},
                    tenant_id=tenant)
        cron_create(conn, "hourly-sync", "0 * * * *", "index_sync", {}, tenant_id=tenant)
    browser_sign_in(page)
    page.goto("/dashboard/cron")
    page.fill("input[name=name]", "bad name")
    page.fill("input[name=schedule]", "@daily")
    page.select_option("select[name=kind]", "reindex")
    page.click("#cron-form button[type=submit]")
    assert page.inner_text("#form-error").startswith("name: 1-128 characters")
    shot(page, "07-cron")
    row = page.locator("tr[data-cron='nightly-report']")
    row.locator("summary", has_text="Delete").click()
    row.locator("button", has_text="Delete nightly-report").click()
    page.wait_for_url("**/dashboard/cron?notice=Deleted+nightly-report.*")
    assert "Deleted nightly-report." in page.inner_text(".alert.ok")
    assert page.locator("tr[data-cron='nightly-report']").count() == 0
    assert page.locator("tr[data-cron='hourly-sync']").count() == 1
    with engine.connect() as conn:
        names = conn.execute(text("SELECT name FROM mdm.aa_cron_entry "
                                  "WHERE name NOT LIKE 'postrelay.%'")).scalars().all()
    assert names == ["hourly-sync"]
    assert page.problems == []


def test_open_an_emails_story(page, engine, tenant, other_tenant):
    fill(engine, tenant, other_tenant)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        event = insert_event(conn, tenant, event_type="user.signed_up", aggregate_type="user",
                             aggregate_id="ann", created_at=now - timedelta(minutes=6),
                             handled_at=now - timedelta(minutes=6),
                             payload={"user": {"email": "ann@example.com", "name": "Ann"}})
        job = insert_job(conn, tenant_id=tenant, kind="email_send", status="done", attempts=2,
                         completed_at=now - timedelta(minutes=1), payload={
                             "template": "welcome", "to": ["ann@example.com"],
                             "context": {"user": {"name": "Ann"}, "plan": "Pro"}})
        insert_email(conn, tenant, job_id=job, event_id=event, status="deferred", attempt=1,
                     message_id=f"<{job}@acme.example>",
                     smtp_code=451, smtp_enhanced="4.7.1",
                     smtp_response="Greylisted, please try again later",
                     created_at=now - timedelta(minutes=5), subject="Welcome to Acme, Ann")
        sent = insert_email(conn, tenant, job_id=job, event_id=event, attempt=2,
                            message_id=f"<{job}@acme.example>",
                            subject="Welcome to Acme, Ann", created_at=now - timedelta(minutes=1),
                            recipient_results={"ann@example.com": {"status": "accepted",
                                                                   "code": 250}})
    browser_sign_in(page)
    page.click("nav.side >> text=Email log")
    page.fill("input[name=recipient]", "ann@example.com")
    page.click("form.filters button[type=submit]")
    assert page.locator("tr[data-email]").count() == 3
    shot(page, "09-emails")
    page.click(f"tr[data-email='{sent}'] a")
    page.wait_for_url(f"**/dashboard/emails/{sent}")
    story = page.inner_text("ol.story")
    for expected in ("user.signed_up", "email_send", "Attempt 1", "Attempt 2",
                     "451 4.7.1", "Greylisted, please try again later", "Ok: queued as 4BC1",
                     "ann@example.com"):
        assert expected in story, expected
    # The preview: rendered again from the job's context with the email templates; the
    # HTML part in a sandboxed frame, where its script cannot run.
    assert page.inner_text("[data-field=subject]") == "Welcome to Acme, Ann"
    assert "your Pro plan is ready." in page.inner_text("[data-field=text]")
    frame = page.frame_locator("iframe.mail-frame")
    assert frame.locator("h1").inner_text() == "Hi Ann"
    assert page.title() != "pwned"
    page.click("summary:has-text('Template context')")
    assert json.loads(page.inner_text("[data-field=context]")) == {
        "user": {"name": "Ann"}, "plan": "Pro"}
    shot(page, "10-email-story")
    # The one thing the console may report: the frame refused the template's script.
    assert all("script" in p.lower() for p in page.problems), page.problems


def test_hostile_payloads_stay_inert(page, engine, tenant, other_tenant):
    fill(engine, tenant, other_tenant)
    with engine.begin() as conn:
        job = insert_job(conn, tenant_id=tenant, kind="email_send", status="dlq", attempts=8,
                         completed_at=datetime.now(UTC), idempotency_key=XSS,
                         payload={"note": XSS, "img": XSS_IMG, "context": {"name": XSS}},
                         last_error=f"ValueError: {XSS_IMG}")
        insert_email(conn, tenant, job_id=job, subject=XSS, template=XSS_IMG,
                     recipients=["x@example.com"], smtp_response=XSS)
        insert_event(conn, tenant, event_type=XSS, dead_at=datetime.now(UTC),
                     last_error=XSS_IMG)
        cron_create(conn, "hostile", "0 3 * * *", "reindex", {"x": XSS}, tenant_id=tenant)
    browser_sign_in(page)
    email = None
    for path in ("/dashboard/", f"/dashboard/jobs/{job}", "/dashboard/jobs?status=dlq",
                 "/dashboard/dlq", "/dashboard/outbox", "/dashboard/cron", "/dashboard/emails"):
        page.goto(path)
        assert page.evaluate("typeof window.__pwned") == "undefined", path
        assert "pwned" not in page.title(), path
        # Only the dashboard's own script element, no injected one, no injected image.
        assert page.evaluate("document.querySelectorAll('script').length") == 1, path
        assert page.locator("img").count() == 0, path
        if path == "/dashboard/emails":
            email = page.locator("tr[data-email] a").first.get_attribute("href")
    assert XSS in page.inner_text("table")  # shown as text, literally
    page.goto(f"/dashboard/jobs/{job}")
    assert XSS in page.inner_text("[data-field=payload]")
    assert XSS_IMG in page.inner_text("[data-field=last-error]")
    shot(page, "11-hostile-job")
    page.goto(email)
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert XSS in page.inner_text("h1")
    page.goto("/dashboard/jobs?q=" + XSS.replace(" ", "+").replace(";", "%3B"))
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.problems == []


def test_tenant_session_pages_and_screens(page, engine, tenant, other_tenant):
    fill(engine, tenant, other_tenant)
    key = tenant_key(engine, "acme-ops", tenant)
    browser_sign_in(page, key)
    assert "acme" in page.inner_text(".who")
    with engine.connect() as conn:
        done = conn.execute(text("SELECT count(*) FROM mdm.aa_job WHERE status = 'done' "
                                 "AND tenant_id = :t"), {"t": tenant}).scalar()
    assert page.inner_text("[data-count=status-done]") == f"{done:,}"
    page.goto("/dashboard/jobs?status=done")
    assert page.locator("tr[data-job]").count() == done
    shot(page, "03-jobs-tenant")
    page.goto("/dashboard/outbox")
    shot(page, "08-outbox")
    page.click("button:has-text('Sign out')")
    page.wait_for_url("**/dashboard/login")
    page.goto("/dashboard/")
    assert page.url.endswith("/dashboard/login")
    assert SERVICE_KEY not in page.content()
    assert page.problems == []


def test_dark_scheme(browser, dash_url, engine, tenant, other_tenant):
    """The same overview under prefers-color-scheme: dark (a screenshot to look at)."""
    fill(engine, tenant, other_tenant)
    context = browser.new_context(base_url=dash_url, color_scheme="dark",
                                  viewport={"width": 1440, "height": 900})
    try:
        page = context.new_page()
        browser_sign_in(page)
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(15, 17, 21)"
        shot(page, "12-overview-dark")
    finally:
        context.close()
