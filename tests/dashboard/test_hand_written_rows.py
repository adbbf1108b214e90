"""Rows that SQL written by hand can hold and postrelay's own calls never write: the pages
that show them still answer."""

from __future__ import annotations

from sqlalchemy import text

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
