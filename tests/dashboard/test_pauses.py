"""The Pauses page: what is paused, since when, by whom; pause and resume forms."""

from __future__ import annotations

from sqlalchemy import text

from tests.dashboard.conftest import csrf_of
from tests.factories import insert_throttle


def test_pause_then_resume_a_kind_from_the_page(admin, engine, tenant):
    token = csrf_of(admin, "/dashboard/pauses")
    assert "Nothing is paused." in admin.get("/dashboard/pauses").text
    done = admin.post("/dashboard/pauses", data={"csrf": token, "action": "pause",
                                                 "kind": "email_send", "tenant": str(tenant)})
    assert done.status_code == 303
    page = admin.get("/dashboard/pauses").text
    assert f'data-pause="email_send/{tenant}"' in page and "dashboard:" in page
    bad = admin.post("/dashboard/pauses", data={"csrf": token, "action": "pause",
                                                "kind": "no_such_kind"})
    assert bad.status_code == 400 and "kind: unknown job kind" in bad.text
    assert admin.post("/dashboard/pauses", data={"csrf": token, "action": "resume",
                                                 "kind": "email_send",
                                                 "tenant": str(tenant)}).status_code == 303
    assert "Nothing is paused." in admin.get("/dashboard/pauses").text
    with engine.connect() as conn:
        actions = conn.execute(text("SELECT action FROM mdm.aa_flow_audit ORDER BY id")).all()
    assert [a for (a,) in actions] == ["paused", "resumed"]


def test_a_tenant_session_pauses_its_own_tenant_only(acme, engine, tenant, other_tenant):
    token = csrf_of(acme, "/dashboard/pauses")
    done = acme.post("/dashboard/pauses", data={"csrf": token, "action": "pause",
                                                "kind": "reindex", "tenant": str(other_tenant)})
    assert done.status_code == 303
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT tenant_id, job_kind::text FROM mdm.aa_job_pause")).all()
    assert rows == [(tenant, "reindex")]
    refused = acme.post("/dashboard/pauses", data={"csrf": token, "action": "pause", "all": "1"})
    assert refused.status_code == 400
    # Without the CSRF token nothing is paused.
    assert acme.post("/dashboard/pauses", data={"action": "pause",
                                                "kind": "bulk_import"}).status_code in (400, 403)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job_pause")).scalar_one() == 1


def test_set_and_remove_a_limit_from_the_page(admin, engine, tenant):
    token = csrf_of(admin, "/dashboard/pauses")
    done = admin.post("/dashboard/limits", data={
        "csrf": token, "action": "set", "kind": "email_send", "tenant": "", "rate": "14/s",
        "burst": "", "concurrency": "5", "key": "domain"})
    assert done.status_code == 303
    page = admin.get("/dashboard/pauses").text
    assert 'data-limit="email_send/"' in page and "14/s" in page
    bad = admin.post("/dashboard/limits", data={"csrf": token, "action": "set",
                                                "kind": "email_send", "rate": "0/s"})
    assert bad.status_code == 400 and "rate: must be more than 0" in bad.text
    assert admin.post("/dashboard/limits", data={"csrf": token, "action": "remove",
                                                 "kind": "email_send"}).status_code == 303
    assert "No limits." in admin.get("/dashboard/pauses").text
    with engine.connect() as conn:
        actions = conn.execute(text("SELECT action FROM mdm.aa_flow_audit ORDER BY id")).all()
    assert [a for (a,) in actions] == ["limit_set", "limit_removed"]


def test_a_tenant_session_limits_its_own_tenant_only(acme, engine, tenant, other_tenant):
    token = csrf_of(acme, "/dashboard/pauses")
    assert acme.post("/dashboard/limits", data={
        "csrf": token, "action": "set", "kind": "reindex", "tenant": str(other_tenant),
        "concurrency": "2"}).status_code == 303
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT tenant_id FROM mdm.aa_job_limit")).all()
    assert rows == [(tenant,)]


def test_the_page_shows_a_throttled_destination_and_why(admin, engine, tenant):
    assert "No destination is throttled." in admin.get("/dashboard/pauses").text
    with engine.begin() as conn:
        insert_throttle(conn, reason="SMTP localhost:25 said mail: 454 4.7.0 slow down")
    page = admin.get("/dashboard/pauses").text
    assert 'data-throttle="email_send/"' in page
    row = page.split('data-throttle="email_send/"')[1].split("</tr>")[0]
    assert "paused" in row and "14/s" in row and "454 4.7.0 slow down" in row


def test_a_tenant_session_leaves_the_operators_pauses_and_limits_alone(admin, acme, engine,
                                                                        tenant):
    token = csrf_of(admin, "/dashboard/pauses")
    admin.post("/dashboard/pauses", data={"csrf": token, "action": "pause",
                                          "kind": "email_send", "tenant": str(tenant)})
    admin.post("/dashboard/limits", data={"csrf": token, "action": "set", "kind": "email_send",
                                          "rate": "14/s"})
    mine = csrf_of(acme, "/dashboard/pauses")
    resumed = acme.post("/dashboard/pauses", data={"csrf": mine, "action": "resume",
                                                   "kind": "email_send"})
    assert resumed.status_code == 403 and "only the operator resumes it" in resumed.text
    escaped = acme.post("/dashboard/limits", data={"csrf": mine, "action": "set",
                                                   "kind": "email_send", "rate": "1000/s"})
    assert escaped.status_code == 403 and "only the operator sets one" in escaped.text
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job_pause")).scalar() == 1
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job_limit "
                                 "WHERE tenant_id IS NOT NULL")).scalar() == 0
