"""An error no handler expects: the 500 page, with the security headers, logged once with
its traceback, and the connection left open for the browser's next request."""

from __future__ import annotations

import logging

from sqlalchemy import text

from tests.dashboard.conftest import insert_email


def test_an_unexpected_error_is_one_500_page_logged_once(admin, engine, tenant, caplog):
    # An attempt's recipient results written by SQL as an array, where the code writes an
    # object of address to result: the message's page fails as nothing expects.
    with engine.begin() as conn:
        email = insert_email(conn, tenant)
        conn.execute(text("UPDATE mdm.aa_email_log SET recipient_results = '[1, 2]' "
                          "WHERE id = :id"), {"id": email})
    caplog.set_level(logging.INFO)
    failed = admin.get(f"/dashboard/emails/{email}")
    assert failed.status_code == 500 and "Something went wrong" in failed.text
    assert "Service role" in failed.text  # inside the dashboard's frame
    assert failed.headers["content-security-policy"].startswith("default-src 'self'")
    assert failed.headers["cache-control"] == "no-store"
    # The same connection serves the next request.
    assert admin.get("/dashboard/dlq").status_code == 200
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage().split()[0] for r in errors] == ["postrelay.dashboard.error"]
    assert errors[0].exc_info is not None
    assert errors[0].fields["path"] == f"/dashboard/emails/{email}"
