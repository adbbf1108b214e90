"""An error no handler expects: the 500 page, with the security headers, logged once with
its traceback, and the connection left open for the browser's next request."""

from __future__ import annotations

import logging

from postrelay.dashboard.routes import emails as email_pages
from tests.dashboard.conftest import insert_email


def test_an_unexpected_error_is_one_500_page_logged_once(admin, engine, tenant, caplog,
                                                         monkeypatch):
    # The message's page meets an error nothing expects (a defect of its own: the server
    # runs in this process).
    def broken(*args, **kwargs):
        raise KeyError("recipient_results")

    with engine.begin() as conn:
        email = insert_email(conn, tenant)
    monkeypatch.setattr(email_pages, "email_story", broken)
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
