"""queue.admin.job_cancel and jobs_cancel on a real PostgreSQL."""

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from postrelay.core.errors import ConflictError, NotFoundError, ValidationError
from postrelay.queue import ensure_tenant
from postrelay.queue.admin import job_cancel, jobs_cancel
from tests.factories import insert_job, job_row

ACTOR = "test:ops"


def insert(engine, tenant_id, **fields) -> uuid.UUID:
    with engine.begin() as conn:
        return insert_job(conn, tenant_id=tenant_id, **fields)


def audit(engine, job_id):
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT action, actor, detail->>'was' FROM mdm.aa_job_audit WHERE job_id = :id"),
            {"id": job_id}).all()


@pytest.mark.parametrize("delay", [0, 3600])  # pending, and scheduled for later
def test_cancel_fails_a_pending_job_with_who_and_when_and_an_audit_row(engine, tenant, delay):
    job = insert(engine, tenant, available_at=datetime.now(UTC) + timedelta(seconds=delay),
                 attempts=2)
    with engine.begin() as conn:
        cancelled = job_cancel(conn, job, actor=ACTOR)
    assert (cancelled.id, cancelled.was) == (job, "pending")
    with engine.connect() as conn:
        row = job_row(conn, job)
        error = conn.execute(text("SELECT last_error FROM mdm.aa_job WHERE id = :id"),
                             {"id": job}).scalar_one()
    assert (row["state"], row["attempts"]) == ("failed", 2)
    assert error.startswith(f"cancelled by {ACTOR} at 20")
    assert audit(engine, job) == [("job_cancelled", ACTOR, "pending")]


@pytest.mark.parametrize("status", ["done", "failed", "dlq"])
def test_cancel_of_a_finished_job_is_a_conflict_and_writes_nothing(engine, tenant, status):
    job = insert(engine, tenant, status=status, completed_at=datetime.now(UTC))
    with engine.begin() as conn, pytest.raises(ConflictError, match=status):
        job_cancel(conn, job, actor=ACTOR)
    assert audit(engine, job) == []


def test_cancel_of_an_unknown_or_another_tenants_job_is_not_found(engine, tenant):
    with engine.begin() as conn:
        other = ensure_tenant(conn, "globex")
    job = insert(engine, tenant)
    with engine.begin() as conn, pytest.raises(NotFoundError):
        job_cancel(conn, uuid.uuid4(), actor=ACTOR)
    with engine.begin() as conn, pytest.raises(NotFoundError):
        job_cancel(conn, job, actor=ACTOR, tenant_id=other)
    with engine.begin() as conn, pytest.raises(ValidationError, match="job_id"):
        job_cancel(conn, "nope", actor=ACTOR)
    with engine.connect() as conn:
        assert job_row(conn, job)["state"] == "pending"


def test_cancel_of_a_running_job_leaves_a_request_for_its_worker(engine, tenant):
    job = insert(engine, tenant, status="running", attempts=1, claimed_by="w1",
                 claimed_at=datetime.now(UTC))
    with engine.begin() as conn:
        assert job_cancel(conn, job, actor=ACTOR).was == "running"
    with engine.connect() as conn:
        assert job_row(conn, job)["state"] == "failed"
        assert conn.execute(text("SELECT job_id, claimed_by, actor FROM mdm.aa_job_cancel")
                            ).all() == [(job, "w1", ACTOR)]


def test_bulk_cancel_by_kind_template_event_and_created_range(engine, tenant):
    with engine.begin() as conn:
        other = ensure_tenant(conn, "globex")
    reindex = insert(engine, tenant)
    welcome = insert(engine, tenant, kind="email_send", payload={"template": "welcome"})
    invoice = insert(engine, tenant, kind="email_send", payload={"template": "invoice"})
    theirs = insert(engine, other, kind="email_send", payload={"template": "welcome"})
    done = insert(engine, tenant, status="done", completed_at=datetime.now(UTC))
    event_id = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO mdm.aa_outbox_delivery (event_id, route, job_id) "
                          "VALUES (:e, 'r', :j)"), {"e": event_id, "j": invoice})

    with engine.begin() as conn:
        assert [c.id for c in jobs_cancel(conn, actor=ACTOR, template="welcome",
                                          tenant_id=tenant)] == [welcome]
        assert [c.id for c in jobs_cancel(conn, actor=ACTOR, event_id=event_id)] == [invoice]
        future = datetime.now(UTC) + timedelta(hours=1)
        assert jobs_cancel(conn, actor=ACTOR, created_from=future) == []
        assert [c.id for c in jobs_cancel(conn, actor=ACTOR, kind="reindex")] == [reindex]
    with engine.connect() as conn:
        assert job_row(conn, theirs)["state"] == "pending"
        assert job_row(conn, done)["state"] == "done"


def test_bulk_cancel_is_bounded_by_its_limit(engine, tenant):
    for _ in range(5):
        insert(engine, tenant)
    with engine.begin() as conn:
        assert len(jobs_cancel(conn, actor=ACTOR, kind="reindex", limit=3)) == 3
        assert len(jobs_cancel(conn, actor=ACTOR, kind="reindex", limit=3)) == 2


@pytest.mark.parametrize(("args", "field"), [
    ({"kind": "no_such_kind"}, "kind"),
    ({"tenant_id": uuid.uuid4()}, "tenant_id"),
    ({}, "filter"),
    ({"kind": "reindex", "limit": 1001}, "limit"),
    ({"created_from": datetime(2026, 1, 1)}, "created_from"),
    ({"event_id": "x"}, "event_id"),
])
def test_bulk_cancel_refuses_bad_input_naming_the_field(engine, tenant, args, field):
    job = insert(engine, tenant)
    with engine.begin() as conn, pytest.raises(ValidationError) as caught:
        jobs_cancel(conn, actor=ACTOR, **args)
    assert caught.value.field == field
    with engine.connect() as conn:
        assert job_row(conn, job)["state"] == "pending"
