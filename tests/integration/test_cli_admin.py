"""The operator commands, run as the real `postrelay` console script against this run's
database."""

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.factories import audit_rows, insert_job, job_row

POSTRELAY = Path(sys.executable).parent / "postrelay"


def run(env: dict[str, str], *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(POSTRELAY), *args], env=env, capture_output=True, text=True,
                          timeout=60)
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def dead(engine, tenant, **fields) -> uuid.UUID:
    with engine.begin() as conn:
        return insert_job(conn, tenant_id=tenant, status="dlq", attempts=8, max_attempts=8,
                          completed_at=datetime.now(UTC), last_error="boom", **fields)


def test_tenants_add_and_list(worker_env, engine, clean_db):
    out = run(worker_env, "tenants", "add", "initech").stdout.strip()
    tenant_id = uuid.UUID(out)
    assert run(worker_env, "tenants", "add", "initech").stdout.strip() == out  # same tenant
    table = run(worker_env, "tenants", "list").stdout
    assert table.splitlines()[0].split() == ["ID", "NAME", "CREATED_AT"]
    assert any(line.startswith(out) and "initech" in line for line in table.splitlines())
    listed = json.loads(run(worker_env, "tenants", "list", "--json").stdout)
    assert {"id": str(tenant_id), "name": "initech"}.items() <= listed[0].items()
    assert [t["name"] for t in listed] == ["initech", "system"]


def test_status_text_and_json(worker_env, engine, tenant):
    with engine.begin() as conn:
        insert_job(conn, tenant_id=tenant)
        insert_job(conn, tenant_id=tenant, kind="email_send", status="dlq")
    data = json.loads(run(worker_env, "status", "--json").stdout)
    assert data["by_status"] == {"pending": 1, "running": 0, "done": 0, "failed": 0, "dlq": 1}
    assert data["by_kind"] == {"reindex": {"pending": 1}, "email_send": {"dlq": 1}}
    assert data["by_tenant"] == {str(tenant): {"pending": 1, "dlq": 1}}
    assert data["due_pending"] == 1 and data["oldest_due_age_secs"] >= 0
    lines = run(worker_env, "status").stdout.splitlines()
    assert lines[0].split() == ["STATUS", "JOBS"]
    assert lines[1].split() == ["pending", "1"] and lines[5].split() == ["dlq", "1"]
    assert any(line.startswith("due pending: 1") for line in lines)
    assert ["email_send", "0", "0", "0", "0", "1"] in [line.split() for line in lines]
    assert ["acme", "1", "0", "0", "0", "1"] in [line.split() for line in lines]


def test_jobs_list_and_show(worker_env, engine, tenant):
    with engine.begin() as conn:
        pending = insert_job(conn, tenant_id=tenant, payload={"n": 1})
    with engine.begin() as conn:
        failed = insert_job(conn, tenant_id=tenant, status="failed", kind="email_send",
                            last_error="Traceback...\nValueError: nope")
    listed = json.loads(run(worker_env, "jobs", "list", "--json").stdout)
    assert [j["id"] for j in listed] == [str(failed), str(pending)]
    only = json.loads(run(worker_env, "jobs", "list", "--status", "failed", "--kind",
                          "email_send", "--tenant", str(tenant), "--limit", "5", "--json").stdout)
    assert [j["id"] for j in only] == [str(failed)]
    table = run(worker_env, "jobs", "list").stdout.splitlines()
    assert table[0].split()[:4] == ["ID", "TENANT", "KIND", "STATUS"]
    assert table[1].split()[:4] == [str(failed), "acme", "email_send", "failed"]
    assert "ValueError: nope" in table[1] and "Traceback" not in table[1]  # the error's last line
    assert run(worker_env, "jobs", "list", "--status", "done").stdout.strip() == "no jobs"

    shown = run(worker_env, "jobs", "show", str(pending)).stdout
    assert f"id:              {pending}" in shown and '"n": 1' in shown
    data = json.loads(run(worker_env, "jobs", "show", str(pending), "--json").stdout)
    assert data["payload"] == {"n": 1} and data["status"] == "pending" and data["attempts"] == 0
    missing = run(worker_env, "jobs", "show", str(uuid.uuid4()), ok=False)
    assert missing.returncode == 1 and "no job" in missing.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["jobs", "list", "--limit", "0"], "limit: must be between 1 and 500"),
        (["jobs", "list", "--limit", "501"], "limit: must be between 1 and 500"),
        (["jobs", "list", "--status", "dead"], "status: must be one of"),
        (["jobs", "list", "--tenant", "acme"], "--tenant: must be a UUID"),
        (["dlq", "list", "--limit", "501"], "limit: must be between 1 and 500"),
        (["dlq", "requeue", "--limit", "1001"], "limit: must be between 1 and 1000"),
        (["jobs", "show", "not-a-uuid"], "JOB_ID: must be a UUID"),
    ],
)
def test_bad_input_is_a_one_line_error(worker_env, clean_db, args, message):
    done = run(worker_env, *args, ok=False)
    assert done.returncode == 1
    assert done.stderr.strip().startswith("error: ") and message in done.stderr
    assert "Traceback" not in done.stderr


def test_dlq_list_retry_and_audit_actor(worker_env, engine, tenant):
    job_id = dead(engine, tenant)
    with engine.begin() as conn:
        insert_job(conn, tenant_id=tenant, status="failed")
    listed = json.loads(run(worker_env, "dlq", "list", "--json").stdout)
    assert [j["id"] for j in listed] == [str(job_id)]
    assert str(job_id) in run(worker_env, "dlq", "list").stdout

    out = run(worker_env, "dlq", "retry", str(job_id)).stdout
    assert f"retried {job_id}" in out
    with engine.connect() as conn:
        row = job_row(conn, job_id)
        (audit,) = audit_rows(conn, job_id)
    assert row["state"] == "pending" and row["attempts"] == 8
    assert audit["action"] == "job_retry"
    assert audit["actor"].startswith("cli:") and "@" in audit["actor"]

    again = run(worker_env, "dlq", "retry", str(job_id), ok=False)
    assert again.returncode == 1 and f"job {job_id} is not in the DLQ" in again.stderr


def test_dlq_retry_scoped_to_another_tenant_is_not_found(worker_env, engine, tenant):
    job_id = dead(engine, tenant)
    other = str(uuid.uuid4())
    done = run(worker_env, "dlq", "retry", str(job_id), "--tenant", other, ok=False)
    assert done.returncode == 1 and "is not in the DLQ" in done.stderr
    with engine.connect() as conn:
        assert job_row(conn, job_id)["state"] == "dlq"


def test_dlq_requeue_prints_the_count(worker_env, engine, tenant):
    ids = [dead(engine, tenant) for _ in range(3)]
    assert run(worker_env, "dlq", "requeue", "--limit", "2").stdout.strip() == "requeued 2"
    assert run(worker_env, "dlq", "requeue").stdout.strip() == "requeued 1"
    assert run(worker_env, "dlq", "requeue").stdout.strip() == "requeued 0"
    with engine.connect() as conn:
        assert {job_row(conn, j)["state"] for j in ids} == {"pending"}
        assert [a["action"] for j in ids for a in audit_rows(conn, j)] == ["job_requeue"] * 3


def test_dlq_discard(worker_env, engine, tenant):
    job_id = dead(engine, tenant, payload={"keep": "me"})
    assert run(worker_env, "dlq", "discard", str(job_id)).stdout.strip() == f"discarded {job_id}"
    with engine.connect() as conn:
        gone = conn.execute(text("SELECT count(*) FROM mdm.aa_job WHERE id = :id"),
                            {"id": job_id}).scalar_one()
        (audit,) = audit_rows(conn, job_id)
    assert gone == 0
    assert audit["action"] == "job_discard" and audit["detail"]["payload"] == {"keep": "me"}
    again = run(worker_env, "dlq", "discard", str(job_id), ok=False)
    assert again.returncode == 1 and "is not in the DLQ" in again.stderr


def test_jobs_cancel_one_then_a_finished_one_is_an_error(worker_env, engine, tenant):
    with engine.begin() as conn:
        job = insert_job(conn, tenant_id=tenant)
    assert run(worker_env, "jobs", "cancel", str(job)).stdout.strip() == (
        f"cancelled {job} (was pending)")
    with engine.connect() as conn:
        assert job_row(conn, job)["state"] == "failed"
        assert audit_rows(conn, job)[0]["action"] == "job_cancelled"
    again = run(worker_env, "jobs", "cancel", str(job), ok=False)
    assert again.returncode == 1 and "is failed" in again.stderr


def test_jobs_cancel_by_filter_prints_the_count(worker_env, engine, tenant):
    with engine.begin() as conn:
        for _ in range(3):
            insert_job(conn, tenant_id=tenant)
        insert_job(conn, tenant_id=tenant, kind="virus_scan")
    out = run(worker_env, "jobs", "cancel", "--kind", "reindex", "--tenant", str(tenant))
    assert out.stdout.strip() == "cancelled 3"
    bad = run(worker_env, "jobs", "cancel", "--kind", "nope", ok=False)
    assert bad.returncode != 0 and "kind" in bad.stderr


def test_a_dead_job_whose_payload_holds_a_very_long_integer_is_listed(worker_env, engine,
                                                                      tenant):
    """SQL written by hand can store an integer of more digits than Python converts: `dlq
    list` then failed for every dead job ("unexpected ValueError"). It shows as its digits."""
    job_id = dead(engine, tenant)
    digits = "7" * 5000
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_job SET payload = CAST(:p AS jsonb) WHERE id = :id"),
                     {"p": f'{{"n": {digits}}}', "id": job_id})
    assert str(job_id) in run(worker_env, "dlq", "list").stdout
    [listed] = json.loads(run(worker_env, "dlq", "list", "--json").stdout)
    assert listed["payload"] == {"n": digits}
    assert f'"n": "{digits}"' in run(worker_env, "jobs", "show", str(job_id)).stdout


def test_jobs_at_an_infinite_available_at_are_listed(worker_env, engine, tenant):
    """SQL written by hand parks a job at available_at 'infinity' (or makes one due at
    '-infinity'): the driver refused to read either, and `jobs list`, `jobs show` and
    `status` failed for every job. They read as the latest and earliest times there are."""
    with engine.begin() as conn:
        parked, early = insert_job(conn, tenant_id=tenant), insert_job(conn, tenant_id=tenant)
        for job_id, at in ((parked, "infinity"), (early, "-infinity")):
            conn.execute(text("UPDATE mdm.aa_job SET available_at = CAST(:at AS timestamptz) "
                              "WHERE id = :id"), {"at": at, "id": job_id})
    listed = {j["id"]: j for j in json.loads(run(worker_env, "jobs", "list", "--json").stdout)}
    assert listed[str(parked)]["available_at"].startswith("9999-12-31T23:59:59")
    assert listed[str(early)]["available_at"].startswith("0001-01-01T00:00:00")
    assert "9999-12-31 23:59:59Z" in run(worker_env, "jobs", "show", str(parked)).stdout
    status = json.loads(run(worker_env, "status", "--json").stdout)
    assert status["due_pending"] == 1 and status["oldest_due_age_secs"] is None
