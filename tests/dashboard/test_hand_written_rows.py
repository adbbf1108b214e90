"""Rows that SQL written by hand can hold and postrelay's own calls never write: the pages
that show them still answer."""

from __future__ import annotations

from sqlalchemy import text

from tests.dashboard.conftest import insert_email, insert_event
from tests.factories import insert_job


def test_a_job_whose_payload_holds_a_very_long_integer_shows_it(admin, engine, tenant):
    """SQL written by hand can store an integer of more digits than Python converts: the
    job's page, and the DLQ's, answered 500. The integer shows as its digits."""
    digits = "7" * 5000
    with engine.begin() as conn:
        job = insert_job(conn, tenant_id=tenant, status="dlq")
        conn.execute(text("UPDATE mdm.aa_job SET payload = CAST(:doc AS jsonb) WHERE id = :id"),
                     {"doc": f'{{"n": {digits}}}', "id": job})
    page = admin.get(f"/dashboard/jobs/{job}")
    assert page.status_code == 200 and digits in page.text
    assert admin.get("/dashboard/dlq").status_code == 200


def test_jobs_at_an_infinite_available_at_show(admin, engine, tenant):
    """A job parked by hand at available_at 'infinity', another made due at '-infinity':
    the overview and their pages answered 500."""
    with engine.begin() as conn:
        jobs = [insert_job(conn, tenant_id=tenant), insert_job(conn, tenant_id=tenant)]
        for job_id, at in zip(jobs, ("infinity", "-infinity"), strict=True):
            conn.execute(text("UPDATE mdm.aa_job SET available_at = CAST(:at AS timestamptz) "
                              "WHERE id = :id"), {"at": at, "id": job_id})
    for path in ("/dashboard/", "/dashboard/jobs", *(f"/dashboard/jobs/{j}" for j in jobs)):
        assert admin.get(path).status_code == 200, path


DEEP = '{"n": ' + "[" * 10_000 + "]" * 10_000 + "}"  # jsonb takes some 15,000 levels
TOO_DEEP = "nested more than 200 levels deep: too deep to show"


def test_payloads_nested_too_deep_to_read_show_as_a_placeholder(admin, engine, tenant):
    """A job's payload, and an outbox event's, nested 10,000 levels deep by hand: Python's
    decoder gives out at about 1,000, and the job's page and the email's story (which
    shows both) answered 500."""
    with engine.begin() as conn:
        event = insert_event(conn, tenant)
        job = insert_job(conn, tenant_id=tenant, kind="email_send", status="dlq")
        email = insert_email(conn, tenant, job_id=job, event_id=event)
        for table, row in (("aa_job", job), ("aa_outbox_event", event)):
            conn.execute(text(f"UPDATE mdm.{table} SET payload = CAST(:doc AS jsonb) "
                              "WHERE id = :id"), {"doc": DEEP, "id": row})
    page = admin.get(f"/dashboard/jobs/{job}")
    assert page.status_code == 200 and TOO_DEEP in page.text
    story = admin.get(f"/dashboard/emails/{email}")
    assert story.status_code == 200 and TOO_DEEP in story.text  # the event's payload
    assert "order.placed" in story.text  # beside the event's other fields
    assert admin.get("/dashboard/dlq").status_code == 200


def test_an_email_story_shows_times_past_pythons_years_and_details_named_like_times(
        admin, engine, tenant):
    """The story's times come as text (to_jsonb) and were read back by key wherever they
    were: a job created at '-infinity' by hand, an event at 'infinity', an attempt finished
    in the year 12000, or an audit row's detail holding `created_at: "yesterday"`, failed
    the email's page (and `emails show`)."""
    with engine.begin() as conn:
        event = insert_event(conn, tenant, event_type="user.signed_up")
        job = insert_job(conn, tenant_id=tenant, kind="email_send")
        email = insert_email(conn, tenant, job_id=job, event_id=event)
        conn.execute(text(
            "INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, actor, detail)"
            " VALUES (:job, :tenant, 'email_send', 'job_note', 'ops',"
            " '{\"created_at\": \"yesterday\"}')"), {"job": job, "tenant": tenant})
        for table, column, at, row in (("aa_job", "created_at", "-infinity", job),
                                       ("aa_outbox_event", "created_at", "infinity", event),
                                       ("aa_email_log", "finished_at", "12000-06-01", email)):
            conn.execute(text(f"UPDATE mdm.{table} SET {column} = CAST(:at AS timestamptz) "
                              "WHERE id = :id"), {"at": at, "id": row})
    story = admin.get(f"/dashboard/emails/{email}")
    assert story.status_code == 200, story.text[:300]
    assert "user.signed_up" in story.text and "job_note" in story.text


def test_jobs_at_times_past_pythons_years_show(admin, engine, tenant):
    """A job written by hand as created in the year 12000, another finished in 44 BC: the
    job lists and their pages answered 500 ("timestamp too large")."""
    with engine.begin() as conn:
        late = insert_job(conn, tenant_id=tenant)
        early = insert_job(conn, tenant_id=tenant, status="dlq")
        conn.execute(text("UPDATE mdm.aa_job SET created_at = '12000-01-01' WHERE id = :id"),
                     {"id": late})
        conn.execute(text("UPDATE mdm.aa_job SET completed_at = '0044-03-15 BC' "
                          "WHERE id = :id"), {"id": early})
    for path in ("/dashboard/", "/dashboard/jobs", "/dashboard/jobs?status=dlq",
                 "/dashboard/dlq", f"/dashboard/jobs/{late}", f"/dashboard/jobs/{early}"):
        assert admin.get(path).status_code == 200, path


def test_an_email_whose_addresses_hold_a_null_shows_it_as_a_dash(admin, engine, tenant):
    """A text[] may hold a NULL element, which postrelay never writes: the pages showed
    "None" where the CLI shows "-"."""
    with engine.begin() as conn:
        email = insert_email(conn, tenant, recipients=["ann@example.com"])
        conn.execute(text("UPDATE mdm.aa_email_log SET to_addresses = ARRAY["
                          "'ann@example.com', NULL], recipients = ARRAY["
                          "'ann@example.com', NULL] WHERE id = :id"), {"id": email})
    for path in (f"/dashboard/emails/{email}", "/dashboard/emails"):
        page = admin.get(path)
        assert page.status_code == 200, path
        assert "ann@example.com, -" in page.text and "None" not in page.text, path


def test_an_email_whose_recipient_results_are_no_object_shows_them(admin, engine, tenant):
    """recipient_results written by hand as an array: the message's page answered 500."""
    with engine.begin() as conn:
        email = insert_email(conn, tenant, recipient_results=["ann@example.com", 550])
    page = admin.get(f"/dashboard/emails/{email}")
    assert page.status_code == 200
    assert "not an object of address: outcome: [&#34;ann@example.com&#34;,550]" in page.text
