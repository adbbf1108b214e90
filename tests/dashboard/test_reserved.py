"""The dashboard keeps the system's rules (postrelay/queue/reserved.py) and every tenant's
data to itself, over real HTTP: the cron form offers and accepts no reserved kind to a
tenant session, nobody creates or deletes a `postrelay.*` entry, names are per tenant, and
a message's story, a job's page and an event's jobs never join another tenant's rows."""

from __future__ import annotations

import re
import uuid

from sqlalchemy import text

from postrelay.orchestrator.admin import email_story
from postrelay.queue.cron import cron_create
from postrelay.relay.admin import outbox_event_get
from tests.dashboard.conftest import csrf_of, insert_email, insert_event
from tests.factories import insert_job, scalar

RESERVED = ("cleanup_jobs", "email_send", "outbox_dispatch")


def kind_options(page: str) -> list[str]:
    select = re.search(r'<select name="kind".*?</select>', page, re.S)
    assert select, page
    return re.findall(r'<option value="([^"]+)"', select.group(0))


def cron_entries(engine, name: str) -> list[uuid.UUID]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT tenant_id FROM mdm.aa_cron_entry WHERE name = :n "
                                      "ORDER BY tenant_id"), {"n": name}).scalars())


def test_the_cron_form_offers_a_tenant_session_no_reserved_kind(acme, admin):
    offered = kind_options(acme.get("/dashboard/cron").text)
    assert "reindex" in offered and not set(RESERVED) & set(offered)
    assert set(RESERVED) <= set(kind_options(admin.get("/dashboard/cron").text))


def test_the_cron_form_refuses_reserved_kinds_from_a_tenant_session(acme, engine):
    token = csrf_of(acme, "/dashboard/cron")
    for kind in RESERVED:
        page = acme.post("/dashboard/cron", data={
            "csrf": token, "name": "sweep", "schedule": "*/10 * * * * *", "kind": kind,
            "payload": '{"retention_days": 0}'})
        assert page.status_code == 403, kind
        assert f"kind &#39;{kind}&#39; is reserved for" in page.text
        assert "tenant keys may not enqueue it" in page.text
    assert cron_entries(engine, "sweep") == []


def test_the_service_role_schedules_system_kinds_in_the_system_tenant_only(admin, engine,
                                                                           tenant):
    token = csrf_of(admin, "/dashboard/cron")
    form = {"csrf": token, "name": "sweep", "schedule": "0 * * * *", "kind": "cleanup_jobs"}
    page = admin.post("/dashboard/cron", data={**form, "tenant": str(tenant)})
    assert page.status_code == 403 and "runs only in the system tenant" in page.text
    assert admin.post("/dashboard/cron", data=form).status_code == 303
    assert cron_entries(engine, "sweep") == [uuid.UUID(int=0)]


def test_nobody_creates_or_deletes_a_postrelay_entry(acme, admin, engine):
    for client in (acme, admin):
        token = csrf_of(client, "/dashboard/cron")
        page = client.post("/dashboard/cron", data={
            "csrf": token, "name": "postrelay.mine", "schedule": "0 * * * *",
            "kind": "reindex"})
        assert page.status_code == 403 and "reserved for the system" in page.text
        response = client.post("/dashboard/cron/postrelay.retention/delete",
                               data={"csrf": token})
        assert response.status_code == 403
    assert cron_entries(engine, "postrelay.mine") == []
    assert cron_entries(engine, "postrelay.retention") == [uuid.UUID(int=0)]
    listed = admin.get("/dashboard/cron").text
    assert "/cron/postrelay.retention/delete" not in listed  # no button for built-ins


def test_cron_names_are_per_tenant_in_the_dashboard(acme, admin, engine, tenant, other_tenant):
    with engine.begin() as conn:
        cron_create(conn, "nightly", "0 3 * * *", "reindex", {}, tenant_id=other_tenant)
    token = csrf_of(acme, "/dashboard/cron")
    form = {"csrf": token, "name": "nightly", "schedule": "0 3 * * *", "kind": "reindex"}
    assert acme.post("/dashboard/cron", data=form).status_code == 303  # globex's is no bar
    taken = acme.post("/dashboard/cron", data=form)
    assert taken.status_code == 409 and "already exists for this tenant" in taken.text
    assert cron_entries(engine, "nightly") == sorted([tenant, other_tenant])
    # The service role's delete button names the entry's tenant.
    page = admin.get("/dashboard/cron").text
    assert page.count('action="/dashboard/cron/nightly/delete"') == 2
    admin_token = csrf_of(admin, "/dashboard/cron")
    assert admin.post("/dashboard/cron/nightly/delete",
                      data={"csrf": admin_token}).status_code == 400  # which one?
    assert admin.post("/dashboard/cron/nightly/delete", data={
        "csrf": admin_token, "tenant": str(other_tenant)}).status_code == 303
    assert cron_entries(engine, "nightly") == [tenant]


# --- joins held to the tenant --------------------------------------------------------------

def test_a_message_story_never_joins_another_tenants_event_or_job(acme, admin, engine, tenant,
                                                                  other_tenant):
    with engine.begin() as conn:
        their_event = insert_event(conn, other_tenant, event_type="invoice.secret",
                                   aggregate_type="ledger", payload={"iban": "DE-GLOBEX-IBAN"})
        their_job = insert_job(conn, tenant_id=other_tenant, kind="email_send",
                               payload={"token": "GLOBEX-JOB-TOKEN"})
        conn.execute(text("INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, "
                          "actor, detail) VALUES (:j, :t, 'email_send', 'job_retry', "
                          "'globex-operator', '{}')"), {"j": their_job, "t": other_tenant})
        # A row of acme's pointing at globex's event (an event id copied from a payload).
        forged = insert_email(conn, tenant, event_id=their_event, subject="Acme hello")
        mine = insert_event(conn, tenant, event_type="user.signed_up")
        honest = insert_email(conn, tenant, event_id=mine, subject="Acme welcome")
    for client in (acme, admin):
        page = client.get(f"/dashboard/emails/{forged}")
        assert page.status_code == 200
        # (The row's own event_id is shown as the row holds it: "not kept", the same answer
        # whether globex's event exists or not.)
        for secret in ("invoice.secret", "ledger", "DE-GLOBEX-IBAN"):
            assert secret not in page.text, secret
        assert "user.signed_up" in client.get(f"/dashboard/emails/{honest}").text
    with engine.connect() as conn:
        story = email_story(conn, forged)  # the CLI's `emails show`: the service role
        assert story["event"] is None
        assert email_story(conn, honest)["event"]["event_type"] == "user.signed_up"
    # The same for a log row whose job id is another tenant's (the job and its audit trail).
    with engine.begin() as conn:
        crossed = insert_email(conn, tenant, job_id=their_job, subject="Acme crossed")
    page = acme.get(f"/dashboard/emails/{crossed}")
    assert page.status_code == 200
    assert "GLOBEX-JOB-TOKEN" not in page.text and "globex-operator" not in page.text
    with engine.connect() as conn:
        story = email_story(conn, crossed)
    assert story["job"] is None and story["audit"] == []


def test_a_jobs_page_and_an_events_jobs_stay_in_the_tenant(acme, engine, tenant, other_tenant):
    with engine.begin() as conn:
        my_job = insert_job(conn, tenant_id=tenant, kind="email_send")
        their_event = insert_event(conn, other_tenant, event_type="invoice.secret")
        their_job = insert_job(conn, tenant_id=other_tenant, kind="outbox_dispatch")
        my_event = insert_event(conn, tenant, event_type="order.placed")
        # Delivery links that cross tenants (written by hand: the relay never does).
        conn.execute(text("INSERT INTO mdm.aa_outbox_delivery (event_id, route, job_id) VALUES "
                          "(:e1, 'r1', :j1), (:e2, 'r2', :j2)"),
                     {"e1": their_event, "j1": my_job, "e2": my_event, "j2": their_job})
        insert_email(conn, other_tenant, job_id=my_job, subject="Globex secret subject")
    page = acme.get(f"/dashboard/jobs/{my_job}")
    assert page.status_code == 200
    for secret in ("invoice.secret", str(their_event)[-8:], "Globex secret subject"):
        assert secret not in page.text, secret
    with engine.connect() as conn:
        event = outbox_event_get(conn, my_event, tenant_id=tenant)
    assert event is not None and event.jobs == []  # the link to globex's job is left out
    assert scalar(engine, "SELECT count(*) FROM mdm.aa_job WHERE id = :j", j=their_job) == 1


def test_a_jobs_page_shows_no_other_tenants_email_or_audit_rows_to_the_service_role(
        admin, engine, tenant, other_tenant):
    # The service role sees every tenant, but a job's page shows the job's own rows: an
    # email log or audit row of globex's that names acme's job (written by hand, or an id
    # copied from a payload) is not acme's job's story, as the job's origin is not.
    with engine.begin() as conn:
        my_job = insert_job(conn, tenant_id=tenant, kind="email_send")
        insert_email(conn, other_tenant, job_id=my_job, subject="Globex secret subject")
        insert_email(conn, tenant, job_id=my_job, subject="Acme own subject")
        conn.execute(text("INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, "
                          "actor, detail) VALUES (:j, :t, 'email_send', 'job_retry', "
                          "'globex-operator', '{}'), (:j, :me, 'email_send', 'job_retry', "
                          "'acme-operator', '{}')"),
                     {"j": my_job, "t": other_tenant, "me": tenant})
    page = admin.get(f"/dashboard/jobs/{my_job}")
    assert page.status_code == 200
    assert "Acme own subject" in page.text and "acme-operator" in page.text
    assert "Globex secret subject" not in page.text and "globex-operator" not in page.text
