"""An error no handler expects: the 500 page, with the security headers, logged once with
its traceback, and the connection left open for the browser's next request."""

from __future__ import annotations

import logging

from sqlalchemy import text

from tests.factories import insert_job


def test_an_unexpected_error_is_one_500_page_logged_once(admin, engine, tenant, caplog):
    # A payload written by SQL nested 3,000 levels deep: jsonb keeps it, Python's decoder
    # gives out (RecursionError), so the job's page fails as nothing expects.
    with engine.begin() as conn:
        job = insert_job(conn, tenant_id=tenant, status="dlq")
        conn.execute(text("UPDATE mdm.aa_job SET payload = CAST(:doc AS jsonb) WHERE id = :id"),
                     {"doc": '{"n": ' + "[" * 3000 + "]" * 3000 + "}", "id": job})
    caplog.set_level(logging.INFO)
    failed = admin.get(f"/dashboard/jobs/{job}")
    assert failed.status_code == 500 and "Something went wrong" in failed.text
    assert "Service role" in failed.text  # inside the dashboard's frame
    assert failed.headers["content-security-policy"].startswith("default-src 'self'")
    assert failed.headers["cache-control"] == "no-store"
    # The same connection serves the next request.
    assert admin.get("/dashboard/dlq").status_code == 200
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage().split()[0] for r in errors] == ["postrelay.dashboard.error"]
    assert errors[0].exc_info is not None and errors[0].fields["path"] == f"/dashboard/jobs/{job}"
