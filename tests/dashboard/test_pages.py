"""The dashboard's pages over plain HTTP: every page answers, filters, the job page, and
the DLQ, cron, outbox and email actions with their effects in the database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import text

from tests.dashboard.conftest import (
    PAGES,
    SERVICE_KEY,
    csrf_of,
    dead,
    form_fields,
    insert_email,
    insert_event,
)
from tests.factories import audit_rows, insert_job, job_row, scalar


def test_every_page_answers(admin, engine, tenant):
    job = dead(engine, tenant, idempotency_key="order-7")
    with engine.begin() as conn:
        email = insert_email(conn, tenant, job_id=job)
    for path in [*PAGES, f"/dashboard/jobs/{job}", f"/dashboard/emails/{email}",
                 "/dashboard/emails?status=sent&recipient=ann@example.com",
                 "/dashboard/jobs?status=failed&kind=reindex&since=2020-01-01T00:00"]:
        assert admin.get(path).status_code == 200, path
    assert admin.get("/dashboard/static/dashboard.css").headers["content-type"].startswith(
        "text/css")

def test_bad_filters_are_a_400_page_not_a_500(admin, tenant):
    for path in ["/dashboard/jobs?status=nope", "/dashboard/jobs?status=done&kind=nope",
                 "/dashboard/jobs?status=done&tenant=x", "/dashboard/jobs?status=done&since=x",
                 "/dashboard/emails?status=nope", "/dashboard/dlq?kind=%00"]:
        response = admin.get(path)
        assert response.status_code == 400, path
        assert "Bad request" in response.text
    assert admin.get("/dashboard/jobs/not-a-uuid").status_code == 404
    assert admin.get(f"/dashboard/emails/{uuid.uuid4()}").status_code == 404

def test_jobs_filter_by_status_kind_tenant_and_time(admin, engine, tenant, other_tenant):
    now = datetime.now(UTC)
    with engine.begin() as conn:
        old = insert_job(conn, tenant_id=tenant, kind="reindex", status="done",
                         completed_at=now - timedelta(days=2))
        new = insert_job(conn, tenant_id=tenant, kind="reindex", status="done",
                         completed_at=now - timedelta(minutes=5))
        other_kind = insert_job(conn, tenant_id=tenant, kind="bulk_import", status="done",
                                completed_at=now)
        other_tenants = insert_job(conn, tenant_id=other_tenant, kind="reindex",
                                   status="done", completed_at=now)
        pending = insert_job(conn, tenant_id=tenant)

    def listed(**params) -> list[str]:
        body = admin.get("/dashboard/jobs", params=params).text
        return [str(j) for j in (old, new, other_kind, other_tenants, pending)
                if f'data-job="{j}"' in body]

    assert listed(status="done") == [str(old), str(new), str(other_kind), str(other_tenants)]
    assert listed(status="pending") == [str(pending)]
    assert listed(status="done", kind="reindex") == [str(old), str(new), str(other_tenants)]
    assert listed(status="done", tenant=str(other_tenant)) == [str(other_tenants)]
    since = (now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    assert listed(status="done", kind="reindex", tenant=str(tenant), since=since) == [str(new)]
    until = (now - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    assert listed(status="done", until=until) == [str(old)]
    body = admin.get("/dashboard/jobs", params={"status": "done"}).text
    assert body.index(str(other_kind)) < body.index(str(old))  # most recently finished first

def test_find_a_job_by_id_or_idempotency_key(admin, acme, engine, tenant, other_tenant):
    with engine.begin() as conn:
        mine = insert_job(conn, tenant_id=tenant, idempotency_key="order-42")
        twin = insert_job(conn, tenant_id=tenant, kind="bulk_import",
                          idempotency_key="order-42")
        theirs = insert_job(conn, tenant_id=other_tenant, idempotency_key="order-9")
    found = admin.get("/dashboard/jobs", params={"q": str(theirs)})
    assert found.status_code == 303 and found.headers["location"] == f"/dashboard/jobs/{theirs}"
    assert admin.get("/dashboard/jobs", params={"q": "order-9"}).headers["location"] == (
        f"/dashboard/jobs/{theirs}")
    both = admin.get("/dashboard/jobs", params={"q": "order-42"})
    assert both.status_code == 200 and str(mine) in both.text and str(twin) in both.text
    # A tenant key finds only its own tenant's jobs.
    assert acme.get("/dashboard/jobs", params={"q": str(mine)}).status_code == 303
    for q in (str(theirs), "order-9"):
        response = acme.get("/dashboard/jobs", params={"q": q})
        assert response.status_code == 200 and "No job has" in response.text

def test_find_a_relay_job_by_its_outbox_key(admin, acme, engine, tenant, other_tenant):
    """The relay's keys are not in job_idempotency_uk: they are found through the link
    their key names, within the caller's tenant."""
    with engine.begin() as conn:
        found = {}
        for owner in (tenant, other_tenant):
            event = insert_event(conn, owner, handled_at=datetime.now(UTC))
            key = f"outbox:{event}:email:welcome"
            found[owner] = (key, insert_job(conn, tenant_id=owner, idempotency_key=key))
            conn.execute(text("INSERT INTO mdm.aa_outbox_delivery (event_id, route, job_id) "
                              "VALUES (:e, 'email:welcome', :j)"),
                         {"e": event, "j": found[owner][1]})
    for key, job in found.values():
        response = admin.get("/dashboard/jobs", params={"q": key})
        assert response.headers["location"] == f"/dashboard/jobs/{job}"
    theirs = acme.get("/dashboard/jobs", params={"q": found[other_tenant][0]})
    assert theirs.status_code == 200 and "No job has" in theirs.text
    # 36 characters of a UUID's alphabet are not always a UUID: no key names one then.
    for odd in ("outbox:", "outbox:not-a-uuid:route", f"outbox:{uuid.uuid4()}:email:welcome",
                "outbox:" + "-" * 36 + ":route", "outbox:" + "f" * 36 + ":route",
                f"outbox:{uuid.uuid4().hex}----:route"):
        for client in (admin, acme):
            response = client.get("/dashboard/jobs", params={"q": odd})
            assert response.status_code == 200 and "No job has" in response.text, odd

def test_job_page_shows_payload_error_timestamps_and_audit_escaped(admin, engine, tenant):
    job = dead(engine, tenant, payload={"html": "<script>alert(1)</script>", "n": 1},
               last_error="Traceback: <img src=x onerror=alert(2)>")
    admin.post("/dashboard/dlq/apply", data={"csrf": csrf_of(admin), "action": "retry",
                                             "ids": str(job)})
    body = admin.get(f"/dashboard/jobs/{job}").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "<script>alert" not in body
    assert "&lt;img src=x onerror=alert(2)&gt;" in body and "<img src=x" not in body
    assert "job_retry" in body and "dashboard:service-role" in body
    assert "Last claimed" in body and "attempt 3 of 3" in body


# --- tenant scoping ----------------------------------------------------------------------

def test_dlq_confirm_then_retry_and_discard_selected(admin, engine, tenant):
    first, second, third = (dead(engine, tenant, ago=a) for a in (30, 20, 10))
    token = csrf_of(admin)
    confirm = admin.post("/dashboard/dlq/confirm", data={
        "csrf": token, "action": "retry", "ids": [str(first), str(second)]})
    assert confirm.status_code == 200 and "Retry 2 jobs?" in confirm.text
    with engine.connect() as conn:  # confirming changes nothing
        assert job_row(conn, first)["state"] == "dlq"
    done = admin.post("/dashboard/dlq/apply", data={
        "csrf": token, "action": "retry", "ids": [str(first), str(second)]})
    assert done.status_code == 303
    page = admin.get(done.headers["location"]).text
    assert "2 jobs retried." in page and str(third) in page and str(first) not in page
    gone = admin.post("/dashboard/dlq/apply", data={"csrf": token, "action": "discard",
                                                    "ids": [str(third), str(first)]})
    assert "1 job discarded; 1 had already left the DLQ." in admin.get(
        gone.headers["location"]).text
    # The notice is signed: a link anyone wrote shows none.
    for link in (gone.headers["location"].replace("1+job", "1%2C000+jobs"),
                 "/dashboard/dlq?done=discarded&n=1000",
                 "/dashboard/dlq?notice=1%2C000+jobs+discarded.&sig=x"):
        page = admin.get(link)
        assert page.status_code == 200 and "discarded" not in page.text, link
    with engine.connect() as conn:
        assert [a["action"] for a in audit_rows(conn, first)] == ["job_retry"]
        assert [a["action"] for a in audit_rows(conn, third)] == ["job_discard"]
        assert audit_rows(conn, third)[0]["actor"] == "dashboard:service-role"
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job WHERE id = :id"),
                            {"id": third}).scalar() == 0

def test_dlq_all_matching_a_filter(admin, engine, tenant, other_tenant):
    reindex = [dead(engine, tenant, kind="reindex") for _ in range(3)]
    other = dead(engine, tenant, kind="bulk_import")
    elsewhere = dead(engine, other_tenant, kind="reindex")
    token = csrf_of(admin)
    form = {"csrf": token, "action": "retry", "scope": "matching", "kind": "reindex",
            "tenant": str(tenant)}
    confirm = admin.post("/dashboard/dlq/confirm", data=form)
    assert "Retry 3 jobs matching this filter?" in confirm.text
    done = admin.post("/dashboard/dlq/apply", data=form_fields(confirm.text, "/dlq/apply"))
    assert "3 jobs retried." in admin.get(done.headers["location"]).text
    with engine.connect() as conn:
        assert [job_row(conn, j)["state"] for j in reindex] == ["pending"] * 3
        assert job_row(conn, other)["state"] == "dlq"
        assert job_row(conn, elsewhere)["state"] == "dlq"

def test_cron_create_and_delete_with_the_apis_messages(admin, api_client, engine, tenant):
    token = csrf_of(admin, "/dashboard/cron")
    good = {"name": "nightly", "schedule": "0 3 * * *", "kind": "reindex",
            "payload": '{"dryRun": true}', "tenant": str(tenant)}
    # The checks queue.cron makes answer in the API's words, field names included.
    for change in ({"schedule": "@daily"}, {"schedule": "61 * * * *"},
                   {"schedule": "* * * *"}, {"name": "bad name"}, {"kind": "nope"},
                   {"tenant": str(uuid.uuid4())}):
        form = {**good, **change}
        page = admin.post("/dashboard/cron", data={**form, "csrf": token})
        assert page.status_code == 400, change
        answer = api_client.post("/v1/functions/cron", json={
            "name": form["name"], "schedule": form["schedule"], "kind": form["kind"],
            "payload": {"dryRun": True}, "tenantId": form["tenant"]})
        message = answer.json()["error"]["message"]
        assert message.replace("'", "&#39;") in page.text, (change, message)
    # Numbers are checked by the API's own types: the same words for the same mistakes.
    for form_field, api_field, typed in (("priority", "priority", "x"),
                                         ("priority", "priority", "40000"),
                                         ("max_attempts", "maxAttempts", "0")):
        page = admin.post("/dashboard/cron", data={**good, form_field: typed, "csrf": token})
        value = int(typed) if typed.isdigit() else typed
        answer = api_client.post("/v1/functions/cron", json={
            "name": "nightly", "schedule": good["schedule"], "kind": "reindex",
            "payload": {}, "tenantId": str(tenant), api_field: value})
        message = answer.json()["error"]["message"]
        assert page.status_code == 400 and message in page.text, (form_field, message)
    for change, field in (({"priority": "x"}, "priority: "), ({"max_attempts": "0"},
                                                              "maxAttempts: "),
                          ({"payload": "[1]"}, "payload: ")):
        page = admin.post("/dashboard/cron", data={**good, **change, "csrf": token})
        assert page.status_code == 400 and field in page.text, change
        assert 'value="nightly"' in page.text  # the form keeps what was typed
    assert admin.post("/dashboard/cron", data={**good, "payload": "{", "csrf": token}
                      ).status_code == 400
    created = admin.post("/dashboard/cron", data={**good, "csrf": token})
    assert created.status_code == 303
    page = admin.get(created.headers["location"]).text
    assert "Created nightly." in page and "0 0 3 * * *" in page
    taken = admin.post("/dashboard/cron", data={**good, "csrf": token})
    assert taken.status_code == 409 and "already exists" in taken.text
    deleted = admin.post("/dashboard/cron/nightly/delete", data={"csrf": token})
    assert "Deleted nightly." in admin.get(deleted.headers["location"]).text
    # The notice rides in the link, signed: a link anyone wrote shows none.
    made_up = deleted.headers["location"].replace("Deleted", "Your+session+has+expired:+sign"
                                                  "+in+at+evil.example.+Deleted")
    for link in (made_up, "/dashboard/cron?notice=Your+session+has+expired",
                 "/dashboard/pauses?notice=Your+session+has+expired&sig=x",
                 "/dashboard/pauses?done=Your+session+has+expired"):
        page = admin.get(link)
        assert page.status_code == 200 and "Your session" not in page.text, link
    with engine.connect() as conn:
        actions = conn.execute(text(
            "SELECT action, actor FROM mdm.aa_cron_audit WHERE name = 'nightly' ORDER BY id"
        )).all()
    assert [tuple(a) for a in actions] == [("cron_create", "dashboard:service-role"),
                                           ("cron_delete", "dashboard:service-role")]
    assert admin.post("/dashboard/cron/nightly/delete", data={"csrf": token}).status_code == 404

def test_an_email_cron_entry_is_checked_as_the_api_checks_it(admin, api_client, engine, tenant):
    # Every firing enqueues the payload: a bad message is refused now, in the API's words,
    # rather than stored to fail at each firing.
    token = csrf_of(admin, "/dashboard/cron")
    form = {"name": "digest", "schedule": "0 3 * * *", "kind": "email_send",
            "payload": '{"template": "welcome", "to": ["not an address"]}'}
    page = admin.post("/dashboard/cron", data={**form, "csrf": token})
    answer = api_client.post("/v1/functions/cron", json={
        **form, "payload": {"template": "welcome", "to": ["not an address"]}})
    message = answer.json()["error"]["message"]
    assert answer.status_code == 400 and message.startswith("payload.to[0]: ")
    assert page.status_code == 400 and message.replace("'", "&#39;") in page.text
    assert scalar(engine, "SELECT count(*) FROM mdm.aa_cron_entry WHERE name = 'digest'") == 0


def test_the_cron_page_shows_since_when_and_why_an_entrys_firings_fail(admin, engine, tenant):
    from postrelay.queue.cron import cron_create

    with engine.begin() as conn:
        cron_create(conn, "too-big", "* * * * * *", "reindex", {}, tenant_id=tenant)
        cron_create(conn, "fine", "* * * * * *", "reindex", {}, tenant_id=tenant)
        conn.execute(text(  # as the scheduler records it (queue/maintenance/scheduler.py)
            "UPDATE mdm.aa_cron_entry SET failing_since = now() - interval '5 minutes', "
            "last_error = 'payload: is 2011 bytes <as> JSON' WHERE name = 'too-big'"))
    page = admin.get("/dashboard/cron").text
    row = page[page.index('data-cron="too-big"'):]
    row = row[:row.index("</tr>")]
    assert 'data-field="failing"' in row and "failing since" in row
    assert "payload: is 2011 bytes &lt;as&gt; JSON" in row
    fine = page[page.index('data-cron="fine"'):]
    assert 'data-field="failing"' not in fine[:fine.index("</tr>")]

def test_outbox_shows_dead_events_and_replays_them(admin, engine, tenant):
    with engine.begin() as conn:
        event = insert_event(conn, tenant, attempts=10, dead_at=datetime.now(UTC),
                             last_error="KeyError: 'customer' <b>")
        insert_event(conn, tenant)  # waiting
    page = admin.get("/dashboard/outbox").text
    assert str(event) in page and "KeyError: &#39;customer&#39; &lt;b&gt;" in page
    assert 'data-count="backlog">1<' in page and 'data-count="dead">1<' in page
    token = csrf_of(admin, "/dashboard/outbox")
    replayed = admin.post("/dashboard/outbox/replay", data={"csrf": token,
                                                            "event_id": str(event)})
    assert "1 event handed back" in admin.get(replayed.headers["location"]).text
    for link in (replayed.headers["location"].replace("1+event", "500+events"),
                 "/dashboard/outbox?replayed=500"):
        page = admin.get(link)
        assert page.status_code == 200 and "handed back" not in page.text, link
    with engine.connect() as conn:
        dead_at = conn.execute(text("SELECT dead_at FROM mdm.aa_outbox_event WHERE id = :id"),
                               {"id": event}).scalar()
    assert dead_at is None
    response = admin.post("/dashboard/outbox/replay", data={"csrf": token})
    assert response.status_code == 400 and "give an event id, a time range" in response.text

def test_email_log_filters_and_story(admin, engine, tenant, other_tenant):
    with engine.begin() as conn:
        event = insert_event(conn, tenant, event_type="user.signed_up",
                             handled_at=datetime.now(UTC))
        job = insert_job(conn, tenant_id=tenant, kind="email_send", status="done",
                         completed_at=datetime.now(UTC),
                         payload={"template": "welcome", "context": {"name": "Ann"}})
        first = insert_email(conn, tenant, job_id=job, event_id=event, status="deferred",
                             message_id=f"<{job}@acme.example>",
                             smtp_code=451, smtp_enhanced="4.7.1",
                             smtp_response="Greylisted, try later", attempt=1,
                             created_at=datetime.now(UTC) - timedelta(minutes=5))
        second = insert_email(conn, tenant, job_id=job, event_id=event, attempt=2,
                              message_id=f"<{job}@acme.example>")
        insert_email(conn, other_tenant, recipients=["bob@example.com"], template="receipt",
                     status="bounced", smtp_code=550)
    def listed(**params) -> int:
        return admin.get("/dashboard/emails", params=params).text.count("data-email=")

    assert listed() == 3
    assert listed(status="deferred") == 1 and listed(status="bounced") == 1
    assert listed(recipient="ANN@example.com") == 2 and listed(template="receipt") == 1
    assert listed(tenant=str(other_tenant)) == 1
    assert listed(since=(datetime.now(UTC) - timedelta(minutes=1)).isoformat()) == 2
    story = admin.get(f"/dashboard/emails/{second}").text
    for expected in ("user.signed_up", "email_send", "Attempt 1", "Attempt 2",
                     "Greylisted, try later", "451", "Ok: queued as 4BC1", "&#34;Ann&#34;",
                     f"/dashboard/emails/{first}", f"/dashboard/jobs/{job}"):
        assert expected in story, expected

@pytest.fixture
def api_client(dash_url):
    with httpx.Client(base_url=dash_url, headers={"apikey": SERVICE_KEY}, timeout=30) as c:
        yield c

def test_the_overview_fragment_is_the_panels_alone(admin, engine, tenant):
    with engine.begin() as conn:
        insert_job(conn, tenant_id=tenant, status="running", claimed_at=datetime.now(UTC))
    fragment = admin.get("/dashboard/panels", headers={"x-dashboard-fragment": "1"})
    assert fragment.status_code == 200
    assert fragment.text.lstrip().startswith('<div class="panels"')
    assert "<html" not in fragment.text and 'data-count="running">1<' in fragment.text
    # The per-kind and per-tenant tables count the job in its row and link to it.
    assert 'data-count="kind-reindex-running">1<' in fragment.text
    assert f'data-count="tenant-{tenant}-running">1<' in fragment.text
    assert f'jobs?status=pending&amp;tenant={tenant}"' in fragment.text


def test_job_page_cancel_button_fails_the_job_and_a_second_cancel_is_409(admin, engine,
                                                                           tenant):
    with engine.begin() as conn:
        job = insert_job(conn, tenant_id=tenant)
    page = admin.get(f"/dashboard/jobs/{job}")
    assert f'action="/dashboard/jobs/{job}/cancel"' in page.text
    token = csrf_of(admin, f"/dashboard/jobs/{job}")
    done = admin.post(f"/dashboard/jobs/{job}/cancel", data={"csrf": token})
    assert done.status_code == 303
    with engine.connect() as conn:
        assert job_row(conn, job)["state"] == "failed"
    page = admin.get(f"/dashboard/jobs/{job}")
    assert "cancelled by dashboard:" in page.text and "Cancel job" not in page.text
    assert admin.post(f"/dashboard/jobs/{job}/cancel",
                      data={"csrf": token}).status_code == 409
    # Without the form's CSRF token nothing is cancelled.
    with engine.begin() as conn:
        other = insert_job(conn, tenant_id=tenant)
    assert admin.post(f"/dashboard/jobs/{other}/cancel", data={}).status_code in (400, 403)
    with engine.connect() as conn:
        assert job_row(conn, other)["state"] == "pending"


def test_cancelling_an_email_whose_event_id_is_not_a_uuid_logs_it_without_one(admin, engine,
                                                                               tenant):
    """The payload is checked only when a worker reads it; the cancel's log row keeps the
    event id only when it is one."""
    event = uuid.uuid4()
    shapes = {"-" * 36: None, "f" * 36: None, str(event): event, event.hex: event,
              str(event).upper(): event}
    jobs = {}
    with engine.begin() as conn:
        for given in shapes:
            jobs[given] = insert_job(conn, tenant_id=tenant, kind="email_send", payload={
                "template": "welcome", "to": ["ann@example.com"], "event_id": given})
    token = csrf_of(admin)
    for given, job in jobs.items():
        done = admin.post(f"/dashboard/jobs/{job}/cancel", data={"csrf": token})
        assert done.status_code == 303, (given, done.text[:300])
    with engine.connect() as conn:
        logged = dict(conn.execute(text(
            "SELECT job_id, event_id FROM mdm.aa_email_log WHERE status = 'cancelled'")).all())
    assert logged == {jobs[given]: kept for given, kept in shapes.items()}
