"""The operator operations of postrelay.queue.admin on a real PostgreSQL."""

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from postrelay.core.errors import NotFoundError, ValidationError
from postrelay.queue import ensure_tenant
from postrelay.queue.admin import (
    dlq_discard,
    dlq_list,
    dlq_requeue,
    dlq_retry,
    job_get,
    job_list,
    queue_status,
    tenant_list,
)
from postrelay.queue.backoff import FixedBackoff
from postrelay.queue.model import Job
from postrelay.queue.outcome import Failure, decide
from postrelay.queue.queries import JOB_SQL
from tests.factories import audit_rows, insert_job, job_row

ACTOR = "test:ops"


@pytest.fixture
def other_tenant(engine, tenant) -> uuid.UUID:
    with engine.begin() as conn:
        return ensure_tenant(conn, "globex")


def insert(engine, tenant_id, **fields) -> uuid.UUID:
    """One job in its own transaction, so that created_at (now()) orders the inserts."""
    with engine.begin() as conn:
        return insert_job(conn, tenant_id=tenant_id, **fields)


def dead(engine, tenant_id, *, died_ago: float = 60.0, **fields) -> uuid.UUID:
    now = datetime.now(UTC)
    fields = {"attempts": 8, "max_attempts": 8, "last_error": "boom", **fields}
    return insert(engine, tenant_id, status="dlq", completed_at=now - timedelta(seconds=died_ago),
                  **fields)


def status_of(engine, job_id) -> str:
    with engine.connect() as conn:
        return job_row(conn, job_id)["state"]


def audit_count(engine, action: str) -> int:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM mdm.aa_job_audit WHERE action = :a"), {"a": action}
        ).scalar_one()


# --- queue_status -------------------------------------------------------------------------

def test_queue_status_of_empty_queue(engine, clean_db):
    with engine.begin() as conn:
        status = queue_status(conn)
    assert dict(status.by_status) == {"pending": 0, "running": 0, "done": 0, "failed": 0, "dlq": 0}
    assert status.by_kind == {} and status.by_tenant == {}
    assert status.due_pending == 0 and status.oldest_due_age_secs is None


def test_queue_status_counts_and_due_backlog(engine, tenant, other_tenant):
    now = datetime.now(UTC)
    with engine.begin() as conn:
        insert_job(conn, tenant_id=tenant, available_at=now - timedelta(seconds=120))
        insert_job(conn, tenant_id=tenant, available_at=now - timedelta(seconds=5))
        # Waiting for its backoff: pending, but neither due nor late.
        insert_job(conn, tenant_id=tenant, available_at=now + timedelta(hours=1))
        insert_job(conn, tenant_id=tenant, kind="email_send", status="running")
        insert_job(conn, tenant_id=other_tenant, kind="email_send", status="dlq")
        insert_job(conn, tenant_id=other_tenant, kind="email_send", status="done")
        insert_job(conn, tenant_id=other_tenant, status="failed")
    with engine.begin() as conn:
        status = queue_status(conn)
        scoped = queue_status(conn, tenant_id=other_tenant)
    assert dict(status.by_status) == {"pending": 3, "running": 1, "done": 1, "failed": 1, "dlq": 1}
    assert status.by_kind == {
        "reindex": {"pending": 3, "failed": 1},
        "email_send": {"running": 1, "dlq": 1, "done": 1},
    }
    assert status.by_tenant == {
        tenant: {"pending": 3, "running": 1},
        other_tenant: {"dlq": 1, "done": 1, "failed": 1},
    }
    assert status.due_pending == 2
    assert 120 <= status.oldest_due_age_secs < 180
    assert dict(scoped.by_status) == {"pending": 0, "running": 0, "done": 1, "failed": 1, "dlq": 1}
    assert list(scoped.by_tenant) == [other_tenant]
    assert scoped.due_pending == 0 and scoped.oldest_due_age_secs is None


# --- job_get / job_list -----------------------------------------------------------------------

def test_job_get_returns_every_column(engine, tenant):
    job_id = insert(engine, tenant, kind="bulk_import", status="failed", payload={"a": [1]},
                    priority=7, attempts=2, max_attempts=5, last_error="stopped",
                    idempotency_key="k", claimed_by="h/1/x")
    with engine.begin() as conn:
        job = job_get(conn, job_id)
        row = job_row(conn, job_id)
    assert job is not None
    assert (job.id, job.tenant_id) == (job_id, tenant)
    assert (job.kind, job.status) == ("bulk_import", "failed")
    assert job.payload == {"a": [1]} and job.priority == 7
    assert (job.attempts, job.max_attempts) == (2, 5)
    assert (job.last_error, job.idempotency_key, job.claimed_by) == ("stopped", "k", "h/1/x")
    assert job.available_at == row["available_at"] and job.created_at == row["created_at"]
    assert job.claimed_at is None and job.completed_at is None and job.created_by is None


def test_job_get_hides_other_tenants_and_unknown_ids(engine, tenant, other_tenant):
    job_id = insert(engine, tenant)
    with engine.begin() as conn:
        assert job_get(conn, job_id, tenant_id=tenant) is not None
        assert job_get(conn, str(job_id), tenant_id=str(tenant)) is not None
        assert job_get(conn, job_id, tenant_id=other_tenant) is None
        assert job_get(conn, uuid.uuid4()) is None
        with pytest.raises(ValidationError) as info:
            job_get(conn, "not-a-uuid")
        assert info.value.field == "job_id"


def test_job_list_newest_first_with_filters(engine, tenant, other_tenant):
    first = insert(engine, tenant, status="pending")
    second = insert(engine, tenant, status="dlq", kind="email_send")
    third = insert(engine, other_tenant, status="pending")
    fourth = insert(engine, tenant, status="pending", kind="email_send")
    with engine.begin() as conn:
        assert [j.id for j in job_list(conn)] == [fourth, third, second, first]
        assert [j.id for j in job_list(conn, limit=2)] == [fourth, third]
        assert [j.id for j in job_list(conn, status="pending")] == [fourth, third, first]
        assert [j.id for j in job_list(conn, kind="email_send")] == [fourth, second]
        assert [j.id for j in job_list(conn, tenant_id=tenant)] == [fourth, second, first]
        picked = job_list(conn, status="pending", kind="email_send", tenant_id=tenant)
        assert [j.id for j in picked] == [fourth]
        assert job_list(conn, tenant_id=other_tenant, status="dlq") == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 501}, "limit"),
        ({"limit": -1}, "limit"),
        ({"limit": True}, "limit"),
        ({"status": "dead"}, "status"),
        ({"status": "DLQ"}, "status"),
        ({"kind": "no_such_kind"}, "kind"),
        ({"tenant_id": "acme"}, "tenant_id"),
    ],
)
def test_job_list_rejects_bad_filters(engine, tenant, kwargs, field):
    insert(engine, tenant)
    with engine.begin() as conn:
        with pytest.raises(ValidationError) as info:
            job_list(conn, **kwargs)
        assert info.value.field == field
        if field == "limit":
            assert info.value.rule == "must be between 1 and 500"
        # Nothing reached the server that could abort the caller's transaction.
        assert len(job_list(conn, limit=500)) == 1


# --- dlq_list -------------------------------------------------------------------------------

def test_dlq_list_only_dead_jobs_most_recent_death_first(engine, tenant, other_tenant):
    older = dead(engine, tenant, died_ago=600)
    newer = dead(engine, tenant, died_ago=60)
    foreign = dead(engine, other_tenant, died_ago=300)
    insert(engine, tenant, status="failed")
    insert(engine, tenant)
    with engine.begin() as conn:
        assert [j.id for j in dlq_list(conn)] == [newer, foreign, older]
        assert [j.id for j in dlq_list(conn, tenant_id=tenant)] == [newer, older]
        assert [j.id for j in dlq_list(conn, limit=1)] == [newer]
        assert all(j.status == "dlq" for j in dlq_list(conn))
        for bad in (0, 501):
            with pytest.raises(ValidationError) as info:
                dlq_list(conn, limit=bad)
            assert info.value.field == "limit"


# --- dlq_retry ------------------------------------------------------------------------------

def test_dlq_retry_keeps_attempts_and_audits(engine, tenant):
    long_ago = datetime(2020, 1, 1, tzinfo=UTC)
    job_id = dead(engine, tenant, attempts=3, max_attempts=3, available_at=long_ago)
    with engine.begin() as conn:
        job = dlq_retry(conn, job_id, actor=ACTOR)
        now = conn.execute(text("SELECT now()")).scalar_one()
    assert job.status == "pending" and job.attempts == 3 and job.completed_at is None
    assert job.available_at == now
    with engine.connect() as conn:
        row = job_row(conn, job_id)
        audits = audit_rows(conn, job_id)
    assert row["state"] == "pending" and row["attempts"] == 3 and row["completed_at"] is None
    assert row["last_error"] == "boom"  # kept for diagnosis
    assert audits == [{"action": "job_retry", "actor": ACTOR,
                       "detail": {"attempts": 3, "max_attempts": 3, "last_error": "boom"}}]


def test_retried_job_gets_exactly_one_more_attempt(engine, tenant):
    job_id = dead(engine, tenant, attempts=8, max_attempts=8)
    with engine.begin() as conn:
        dlq_retry(conn, job_id, actor=ACTOR)
    with engine.begin() as conn:
        claimed = conn.execute(
            JOB_SQL["job_claim"],
            {"worker": "w", "demand": 10, "tenant_ids": None, "kinds": None, "fair": False},
        ).fetchall()
    job = Job(*claimed[0])
    assert job.id == job_id and job.attempts == 9
    # The worker's own decision: one failure and it is dead again, no further retries.
    assert job.is_last_attempt
    assert decide(job, Failure(RuntimeError("again")), FixedBackoff()).status == "dlq"


def test_dlq_retry_wakes_idle_workers_after_commit(engine, tenant, libpq):
    import psycopg

    job_id = dead(engine, tenant)
    with psycopg.connect(libpq, autocommit=True) as listener:
        listener.execute("LISTEN postrelay_jobs")
        with engine.begin() as conn:
            dlq_retry(conn, job_id, actor=ACTOR)
        assert len(list(listener.notifies(timeout=1.0, stop_after=1))) == 1


@pytest.mark.parametrize("status", ["pending", "running", "done", "failed"])
def test_dlq_retry_refuses_live_jobs(engine, tenant, status):
    job_id = insert(engine, tenant, status=status, attempts=1)
    message = f"job {job_id} is not in the DLQ"
    with engine.begin() as conn, pytest.raises(NotFoundError, match=message):
        dlq_retry(conn, job_id, actor=ACTOR)
    assert status_of(engine, job_id) == status
    assert audit_count(engine, "job_retry") == 0


def test_dlq_retry_of_other_tenants_or_unknown_job_is_not_found(engine, tenant, other_tenant):
    job_id = dead(engine, tenant)
    with engine.begin() as conn:
        with pytest.raises(NotFoundError):
            dlq_retry(conn, job_id, actor=ACTOR, tenant_id=other_tenant)
        with pytest.raises(NotFoundError):
            dlq_retry(conn, uuid.uuid4(), actor=ACTOR)
    assert status_of(engine, job_id) == "dlq"
    with engine.begin() as conn:
        assert dlq_retry(conn, job_id, actor=ACTOR, tenant_id=tenant).status == "pending"


def test_admin_writes_join_the_callers_transaction(engine, tenant):
    job_id = dead(engine, tenant)
    other = dead(engine, tenant)
    with engine.connect() as conn, conn.begin() as txn:
        dlq_retry(conn, job_id, actor=ACTOR)
        dlq_discard(conn, other, actor=ACTOR)
        assert dlq_requeue(conn, actor=ACTOR) == 0
        txn.rollback()
    assert status_of(engine, job_id) == "dlq" and status_of(engine, other) == "dlq"
    assert audit_count(engine, "job_retry") == audit_count(engine, "job_discard") == 0


# --- dlq_requeue ----------------------------------------------------------------------------

def test_dlq_requeue_at_most_1000_per_call(engine, tenant):
    with engine.begin() as conn:
        for i in range(1005):
            insert_job(conn, tenant_id=tenant, status="dlq", attempts=8, max_attempts=8,
                       completed_at=datetime.now(UTC), payload={"i": i})
        insert_job(conn, tenant_id=tenant, status="failed")
    with engine.begin() as conn:
        assert dlq_requeue(conn, actor=ACTOR) == 1000
    with engine.begin() as conn:
        assert dlq_requeue(conn, actor=ACTOR) == 5
    with engine.begin() as conn:
        assert dlq_requeue(conn, actor=ACTOR) == 0
        status = queue_status(conn)
        attempts = conn.execute(
            text("SELECT DISTINCT attempts FROM mdm.aa_job WHERE status = 'pending'")
        ).scalars().all()
    assert status.by_status["pending"] == 1005 and status.by_status["dlq"] == 0
    assert status.by_status["failed"] == 1  # only dead jobs are requeued
    assert attempts == [8]
    assert audit_count(engine, "job_requeue") == 1005


def test_dlq_requeue_takes_the_oldest_deaths_first(engine, tenant, other_tenant):
    newest = dead(engine, tenant, died_ago=10)
    oldest = dead(engine, tenant, died_ago=1000)
    middle = dead(engine, tenant, died_ago=100)
    foreign = dead(engine, other_tenant, died_ago=5000)
    with engine.begin() as conn:
        assert dlq_requeue(conn, actor=ACTOR, tenant_id=tenant, limit=2) == 2
    assert [status_of(engine, j) for j in (oldest, middle, newest, foreign)] == [
        "pending", "pending", "dlq", "dlq"
    ]
    with engine.connect() as conn:
        assert audit_rows(conn, oldest)[0]["action"] == "job_requeue"
        assert audit_rows(conn, oldest)[0]["actor"] == ACTOR
        assert audit_rows(conn, newest) == []


def test_concurrent_requeues_skip_each_others_rows(engine, tenant):
    for i in range(5):
        dead(engine, tenant, died_ago=100 - i)
    with engine.connect() as first, first.begin():
        assert dlq_requeue(first, actor=ACTOR, limit=3) == 3
        # The first transaction still holds its three rows: the second passes them by
        # instead of waiting, and takes the other two.
        with engine.connect() as second, second.begin():
            second.execute(text("SET LOCAL lock_timeout = '2s'"))
            assert dlq_requeue(second, actor=ACTOR) == 2
    assert audit_count(engine, "job_requeue") == 5


@pytest.mark.parametrize("limit", [0, 1001, -5])
def test_dlq_requeue_rejects_bad_limit(engine, tenant, limit):
    job_id = dead(engine, tenant)
    with engine.begin() as conn, pytest.raises(ValidationError) as info:
        dlq_requeue(conn, actor=ACTOR, limit=limit)
    assert info.value.field == "limit" and info.value.rule == "must be between 1 and 1000"
    assert status_of(engine, job_id) == "dlq"


def test_admin_writes_need_an_actor(engine, tenant):
    job_id = dead(engine, tenant)
    with engine.begin() as conn:
        for call in (lambda: dlq_retry(conn, job_id, actor=""),
                     lambda: dlq_requeue(conn, actor=" "),
                     lambda: dlq_discard(conn, job_id, actor="")):
            with pytest.raises(ValidationError) as info:
                call()
            assert info.value.field == "actor"


# --- dlq_discard ----------------------------------------------------------------------------

def test_dlq_discard_deletes_and_keeps_the_job_in_the_audit(engine, tenant):
    job_id = dead(engine, tenant, payload={"to": "a@example.com"}, attempts=4, max_attempts=4,
                  idempotency_key="mail-1")
    with engine.connect() as conn:
        before = job_row(conn, job_id)
    with engine.begin() as conn:
        assert dlq_discard(conn, job_id, actor=ACTOR) is None
        assert job_get(conn, job_id) is None
    with engine.connect() as conn:
        (audit,) = audit_rows(conn, job_id)
        tenant_of_audit = conn.execute(
            text("SELECT tenant_id FROM mdm.aa_job_audit WHERE job_id = :id"), {"id": job_id}
        ).scalar_one()
    assert audit["action"] == "job_discard" and audit["actor"] == ACTOR
    assert tenant_of_audit == tenant
    kept = audit["detail"]
    assert kept["id"] == str(job_id) and kept["tenant_id"] == str(tenant)
    assert kept["job_kind"] == "reindex" and kept["status"] == "dlq"
    assert kept["payload"] == {"to": "a@example.com"}
    assert (kept["attempts"], kept["max_attempts"]) == (4, 4)
    assert kept["last_error"] == "boom" and kept["idempotency_key"] == "mail-1"
    assert kept["priority"] == before["priority"] and kept["completed_at"] is not None


def test_dlq_discard_refuses_live_other_tenants_and_twice(engine, tenant, other_tenant):
    live = insert(engine, tenant, status="running")
    job_id = dead(engine, tenant)
    with engine.begin() as conn:
        with pytest.raises(NotFoundError, match=f"job {live} is not in the DLQ"):
            dlq_discard(conn, live, actor=ACTOR)
        with pytest.raises(NotFoundError):
            dlq_discard(conn, job_id, actor=ACTOR, tenant_id=other_tenant)
    assert status_of(engine, live) == "running" and status_of(engine, job_id) == "dlq"
    with engine.begin() as conn:
        dlq_discard(conn, job_id, actor=ACTOR, tenant_id=tenant)
    with engine.begin() as conn, pytest.raises(NotFoundError):
        dlq_discard(conn, job_id, actor=ACTOR)
    assert audit_count(engine, "job_discard") == 1


# --- tenants --------------------------------------------------------------------------------

def test_tenant_list_by_name(engine, tenant, other_tenant):
    with engine.begin() as conn:
        tenants = tenant_list(conn)
    assert [(t.name, t.id) for t in tenants] == [
        ("acme", tenant), ("globex", other_tenant), ("system", uuid.UUID(int=0))
    ]
