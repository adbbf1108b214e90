"""Delivery feedback in the dashboard: the email story's timeline shows what came back after
the SMTP handoff, and the overview shows each tenant's bounce and complaint rates over 24 h
and 7 days — a tenant's session only its own."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

from postrelay.orchestrator.feedback import Feedback, record_feedback
from tests.dashboard.conftest import insert_email


def _message_id(domain: str) -> str:
    """A Message-ID as postrelay makes them: `<job id@domain>`."""
    return f"<{uuid.uuid4()}@{domain}>"


def _record(engine, message_id, kind, source, event_id, status=None, diagnostic=None):
    with engine.begin() as conn:
        record_feedback(conn, Feedback(kind=kind, source=source, recipient=None,
                                       status=status, diagnostic=diagnostic,
                                       source_event_id=event_id, message_id=message_id))


def test_the_story_shows_feedback_after_the_attempts(admin, engine, tenant):
    m1 = _message_id("acme.example")
    with engine.begin() as conn:
        log = insert_email(conn, tenant, job_id=uuid.UUID(m1[1:37]), message_id=m1)
    _record(engine, m1, "delayed", "sendgrid", "e1", "4.4.1", "try again later")
    _record(engine, m1, "bounced", "ses", "e2", "5.1.1",
            "smtp; 550 5.1.1 <script>user unknown</script>")
    story = admin.get(f"/dashboard/emails/{log}").text
    steps = re.findall(r'data-feedback="([a-z-]+)"', story)
    assert steps == ["delayed", "bounced"]
    assert story.index("Attempt 1") < story.index('data-feedback="delayed"')
    assert "from ses" in story and "address suppressed" in story
    assert "&lt;script&gt;user unknown&lt;/script&gt;" in story and "<script>user" not in story
    assert 'class="chip s-bounced">bounced' in story  # the delivery outcome beside `sent`


def test_the_story_is_told_in_time_order(admin, engine, tenant):
    """An operator's retry between two attempts was shown after the feedback, whatever its
    time: the story read as if the retry came last."""
    from sqlalchemy import text

    mid = _message_id("acme.example")
    job = uuid.UUID(mid[1:37])
    start = datetime.now(UTC) - timedelta(minutes=10)
    with engine.begin() as conn:
        insert_email(conn, tenant, job_id=job, message_id=mid, status="failed",
                     created_at=start)
        conn.execute(text(
            "INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, actor, "
            "created_at) VALUES (:job, :tenant, 'email_send', 'job_retry', 'cli:ops', :at)"),
            {"job": job, "tenant": tenant, "at": start + timedelta(minutes=1)})
        log = insert_email(conn, tenant, job_id=job, message_id=mid, attempt=2,
                           created_at=start + timedelta(minutes=2))
    _record(engine, mid, "bounced", "ses", "e1", "5.1.1")
    story = admin.get(f"/dashboard/emails/{log}").text
    order = [story.index(mark) for mark in ("Attempt 1", "job_retry", "Attempt 2",
                                            'data-feedback="bounced"')]
    assert order == sorted(order)


def test_the_overview_shows_rates_per_tenant_scoped_to_a_tenant_session(
        admin, acme, engine, tenant, other_tenant):
    recent = [_message_id("acme.example") for _ in range(4)]
    old = _message_id("acme.example")
    with engine.begin() as conn:
        for mid in recent:
            insert_email(conn, tenant, job_id=uuid.UUID(mid[1:37]), message_id=mid)
        insert_email(conn, tenant, job_id=uuid.UUID(old[1:37]), message_id=old,
                     created_at=datetime.now(UTC) - timedelta(days=3))
        insert_email(conn, other_tenant, recipients=["bob@example.com"])
    _record(engine, recent[0], "complaint", "sendgrid", "c1")
    _record(engine, old, "bounced", "mail", "b1", "5.1.1")
    page = admin.get("/dashboard/").text
    section = page[page.index('id="rates"'):]
    row = section[section.index(f'data-tenant="{tenant}"'):]
    row = row[:row.index("</tr>")]
    assert re.search(r'data-rate="complaint-24h"[^>]*>25\.00%', row)  # 1 of 4, over 0.1%
    assert re.search(r'data-rate="bounce-24h"[^>]*>0\.00%', row)
    assert re.search(r'data-rate="bounce-7d"[^>]*>20\.00%', row)  # 1 of 5
    assert 'class="error-text">25.00%' in row
    assert f'data-tenant="{other_tenant}"' in section
    own = acme.get("/dashboard/").text
    own_rates = own[own.index('id="rates"'):]
    assert f'data-tenant="{tenant}"' in own_rates
    assert f'data-tenant="{other_tenant}"' not in own_rates and "globex" not in own_rates
