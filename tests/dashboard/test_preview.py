"""The dashboard's preview of what was sent: the message rendered again from its job's
payload, or from its event's for a split route's message, framed in a sandbox."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from postrelay.relay import emit
from tests.dashboard.conftest import insert_email
from tests.factories import insert_job


def test_the_email_preview_is_rendered_again_and_framed_in_a_sandbox(admin, acme, engine,
                                                                     tenant, other_tenant):
    with engine.begin() as conn:
        job = insert_job(conn, tenant_id=tenant, kind="email_send", status="done",
                         completed_at=datetime.now(UTC), payload={
                             "template": "welcome", "to": ["ann@example.com"],
                             "context": {"user": {"name": "<b>Ann</b>"}, "plan": "Pro"}})
        sent = insert_email(conn, tenant, job_id=job, template_version="0123456789ab")
        orphan = insert_email(conn, tenant, template="welcome")  # its job is gone
        broken = insert_email(conn, other_tenant, template="no-such-template",
                              job_id=insert_job(conn, tenant_id=other_tenant,
                                                kind="email_send", payload={"context": {}}))
    story = admin.get(f"/dashboard/emails/{sent}").text
    assert "Welcome to Acme, &lt;b&gt;Ann&lt;/b&gt;" in story  # the subject, rendered now
    assert "the message was sent with version 0123456789ab" in story
    assert f'src="/dashboard/emails/{sent}/preview"' in story and "sandbox" in story
    frame = admin.get(f"/dashboard/emails/{sent}/preview")
    assert frame.status_code == 200
    assert "<h1" in frame.text and "&lt;b&gt;Ann&lt;/b&gt;" in frame.text  # autoescaped HTML
    csp = frame.headers["content-security-policy"]
    assert "sandbox" in csp and "default-src 'none'" in csp and "script-src" not in csp
    assert frame.headers["x-frame-options"] == "SAMEORIGIN"
    assert "job retention" in admin.get(f"/dashboard/emails/{orphan}").text
    assert admin.get(f"/dashboard/emails/{orphan}/preview").status_code == 404
    assert "Not rendered again" in admin.get(f"/dashboard/emails/{broken}").text
    assert acme.get(f"/dashboard/emails/{broken}/preview").status_code == 404

def test_a_split_route_s_message_is_previewed_with_its_event_s_payload(admin, engine, tenant):
    """Its job names the event (context_from_event) instead of carrying a copy."""
    with engine.begin() as conn:
        event = emit(conn, "team.formed", {"user": {"name": "Bea"}, "plan": "Team"},
                     tenant_id=tenant, aggregate_type="team", aggregate_id="t1")
        shared = {"template": "welcome", "to": ["ann@example.com"], "context": {},
                  "event_id": str(event), "context_from_event": True}
        sent = insert_email(conn, tenant, event_id=event, job_id=insert_job(
            conn, tenant_id=tenant, kind="email_send", status="done",
            completed_at=datetime.now(UTC), payload=shared))
        gone = insert_email(conn, tenant, event_id=uuid.uuid4(), job_id=insert_job(
            conn, tenant_id=tenant, kind="email_send", status="done",
            completed_at=datetime.now(UTC), payload={**shared, "event_id": str(uuid.uuid4())}))
    story = admin.get(f"/dashboard/emails/{sent}").text
    assert "Welcome to Acme, Bea" in story and "team.formed" in story
    assert "Your Team plan" in admin.get(f"/dashboard/emails/{sent}/preview").text
    assert "The event is gone (outbox retention)" in admin.get(f"/dashboard/emails/{gone}").text
