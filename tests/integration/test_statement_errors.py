"""A statement that fails names no parameter in its error: errors are logged, and the
parameters may be a webhook secret, a job's payload or an address."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from postrelay.core.db import Database, sqlalchemy_url


def test_a_failed_statement_keeps_its_parameters_out_of_its_error(database_url):
    db = Database(url=sqlalchemy_url(database_url))
    try:
        with db.sync_engine().connect() as conn, pytest.raises(DBAPIError) as failed:
            conn.execute(text("SELECT CAST(:secret AS text), 1 / 0"),
                         {"secret": "whsec-do-not-log-me"})
    finally:
        db.close()
    assert "whsec-do-not-log-me" not in str(failed.value)
    assert "whsec-do-not-log-me" not in repr(failed.value)
    assert "division by zero" in str(failed.value)
