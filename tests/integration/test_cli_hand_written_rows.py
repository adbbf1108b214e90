"""Rows that SQL written by hand can hold and postrelay's own calls never write, through the
real `postrelay` console script: the commands that list them still answer, with the rows
beside them."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from sqlalchemy import text

from tests.dashboard.conftest import insert_email, insert_event
from tests.factories import insert_job
from tests.integration.test_cli_admin import run

# PostgreSQL's jsonb parser takes about 15,000 levels under its default max_stack_depth.
DEEP = '{"n": ' + "[" * 10_000 + "]" * 10_000 + "}"
PLACEHOLDER = {"_unreadable": "nested more than 200 levels deep: too deep to show"}


def set_column(engine, table: str, row: uuid.UUID, column: str, value: str,
               cast: str = "jsonb") -> None:
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE mdm.{table} SET {column} = CAST(:v AS {cast}) "
                          "WHERE id = :id"), {"v": value, "id": row})


def test_jobs_nested_too_deep_to_read_are_listed_with_a_placeholder(worker_env, engine,
                                                                     tenant):
    """A payload nested 10,000 levels deep: `dlq list`, `jobs list` and `jobs show` failed
    with RecursionError for every job beside it."""
    with engine.begin() as conn:
        deep, plain = (insert_job(conn, tenant_id=tenant, status="dlq", payload={"n": n},
                                  completed_at=datetime.now(UTC)) for n in (1, 2))
    set_column(engine, "aa_job", deep, "payload", DEEP)
    for command in (("dlq", "list"), ("jobs", "list")):
        listed = json.loads(run(worker_env, *command, "--json").stdout)
        assert {j["id"]: j["payload"] for j in listed} == {
            str(deep): PLACEHOLDER, str(plain): {"n": 2}}, command
        table = run(worker_env, *command).stdout
        assert str(deep) in table and str(plain) in table, command
    shown = run(worker_env, "jobs", "show", str(deep)).stdout
    assert '"_unreadable": "nested more than 200 levels deep: too deep to show"' in shown
    assert json.loads(run(worker_env, "jobs", "show", str(deep), "--json").stdout)[
        "payload"] == PLACEHOLDER


def test_an_email_story_shows_an_event_payload_nested_too_deep(worker_env, engine, tenant):
    """`emails show` read the event's payload inside the event: nested 10,000 levels deep,
    it failed the whole story."""
    with engine.begin() as conn:
        event = insert_event(conn, tenant, event_type="user.signed_up")
        job = insert_job(conn, tenant_id=tenant, kind="email_send", payload={"n": 1})
        email = insert_email(conn, tenant, job_id=job, event_id=event)
    set_column(engine, "aa_outbox_event", event, "payload", DEEP)
    story = json.loads(run(worker_env, "emails", "show", str(email), "--json").stdout)
    assert story["event"]["payload"] == PLACEHOLDER and story["event"]["headers"] == {}
    assert story["event"]["event_type"] == "user.signed_up"
    assert story["job"]["payload"] == {"n": 1} and story["job"]["status"] == "pending"
    assert "user.signed_up" in run(worker_env, "emails", "show", str(email)).stdout


def test_an_email_story_reads_times_past_pythons_years(worker_env, engine, tenant):
    """`emails show` read the story's times back from text by key, wherever they were: a
    job created at '-infinity', an event at 'infinity', or a time in a hand-written audit
    detail that is no time, failed the whole story."""
    with engine.begin() as conn:
        event = insert_event(conn, tenant, event_type="user.signed_up")
        job = insert_job(conn, tenant_id=tenant, kind="email_send")
        email = insert_email(conn, tenant, job_id=job, event_id=event)
        conn.execute(text(
            "INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, actor, detail)"
            " VALUES (:job, :tenant, 'email_send', 'job_note', 'ops',"
            " '{\"created_at\": \"yesterday\"}')"), {"job": job, "tenant": tenant})
    set_column(engine, "aa_job", job, "created_at", "-infinity", "timestamptz")
    set_column(engine, "aa_outbox_event", event, "created_at", "infinity", "timestamptz")
    story = json.loads(run(worker_env, "emails", "show", str(email), "--json").stdout)
    assert story["job"]["created_at"].startswith("0001-01-01T00:00:00")
    assert story["event"]["created_at"].startswith("9999-12-31T23:59:59")
    assert [a["detail"] for a in story["audit"]] == [{"created_at": "yesterday"}]
    assert "user.signed_up" in run(worker_env, "emails", "show", str(email)).stdout


def test_jobs_at_times_past_pythons_years_are_listed(worker_env, engine, tenant):
    """A job written by hand as created in the year 12000, or finished in 44 BC: `jobs list`
    and `dlq list` failed ("timestamp too large") for every job beside it."""
    with engine.begin() as conn:
        odd, plain = (insert_job(conn, tenant_id=tenant, status="dlq",
                                 completed_at=datetime.now(UTC)) for _ in range(2))
        conn.execute(text("UPDATE mdm.aa_job SET created_at = '12000-01-01', "
                          "completed_at = '0044-03-15 BC' WHERE id = :id"), {"id": odd})
    for command in (("dlq", "list"), ("jobs", "list")):
        listed = {j["id"]: j for j in json.loads(run(worker_env, *command, "--json").stdout)}
        assert set(listed) == {str(odd), str(plain)}, command
        assert listed[str(odd)]["created_at"].startswith("9999-12-31T23:59:59.999999")
        assert listed[str(odd)]["completed_at"].startswith("0001-01-01T00:00:00")


def test_an_email_whose_addresses_hold_a_null_is_listed(worker_env, engine, tenant):
    """A text[] column may hold NULL elements, which postrelay never writes: `postrelay
    emails` failed ("sequence item 0: expected str instance") for every row beside it, and
    `emails show` for its own. The NULL shows as "-"."""
    with engine.begin() as conn:
        odd = insert_email(conn, tenant, recipients=["ann@example.com"])
        plain = insert_email(conn, tenant, recipients=["bob@example.com"])
        conn.execute(text("UPDATE mdm.aa_email_log SET to_addresses = "
                          "ARRAY['ann@example.com', NULL] WHERE id = :id"), {"id": odd})
    listed = run(worker_env, "emails").stdout
    assert str(odd) in listed and str(plain) in listed and "bob@example.com" in listed
    assert "ann@example.com, -" in listed
    assert "to ann@example.com, -" in run(worker_env, "emails", "show", str(odd)).stdout


def test_an_email_whose_recipient_results_are_no_object_is_shown(worker_env, engine, tenant):
    """recipient_results written by hand as an array: `emails show` failed."""
    with engine.begin() as conn:
        email = insert_email(conn, tenant, recipient_results=["ann@example.com", 550])
    shown = run(worker_env, "emails", "show", str(email)).stdout
    assert '_unreadable: "not an object of address: outcome: [\\"ann@example.com\\",550]"' \
        in shown
