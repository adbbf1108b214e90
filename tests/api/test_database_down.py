"""The API on a database that is down or not migrated: `/metrics` still answers (with
`postrelay_database_up 0` and every collector down), and every other answer is a 503 that
says which, never a 500 and a traceback in the log."""

from __future__ import annotations

import logging

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import SERVICE_KEY, error
from tests.api.server import serve_database
from tests.migrations import throwaway_database

# Port 9 on loopback (discard): nothing listens there, the connection is refused.
UNREACHABLE = "postgresql://nobody@127.0.0.1:9/none"
# What a client sends that is not the service-role key: it must be looked up.
SOME_KEY = "k" * 43


def _database_up(base: str) -> float:
    scraped = httpx.get(f"{base}/metrics", headers={"apikey": SERVICE_KEY}, timeout=30)
    assert scraped.status_code == 200, scraped.text
    families = {f.name: f for f in text_string_to_metric_families(scraped.text)}
    assert set(families) == {"postrelay_database_up", "postrelay_collector_up"}, scraped.text
    assert {s.value for s in families["postrelay_collector_up"].samples} == {0}
    return families["postrelay_database_up"].samples[0].value


def _no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert logged == [], [r.getMessage() for r in logged]


def test_an_unreachable_database_is_a_503_not_a_500(caplog):
    with serve_database(UNREACHABLE, SERVICE_KEY) as base:
        assert _database_up(base) == 0
        for headers in ({"apikey": SOME_KEY}, {"apikey": SERVICE_KEY}):
            response = httpx.get(f"{base}/v1/functions/jobs", headers=headers, timeout=30)
            err = error(response, 503)
            assert err["code"] == "not_ready" and "database" in err["message"], err
            assert response.headers["retry-after"] == "5"
            # The driver's words name the database's address: the log's, not the answer's.
            assert "127.0.0.1" not in err["message"] and "port 9" not in err["message"]
        # A tenant key cannot be told from a wrong one while the database is away; the
        # answer must not say "invalid key" to a key that may well be right.
        err = error(httpx.get(f"{base}/metrics", headers={"apikey": SOME_KEY}, timeout=30), 503)
        assert err["code"] == "not_ready"
    _no_traceback(caplog)
    assert any(getattr(r, "event", None) == "postrelay.api.database_unavailable"
               and "port 9" in r.fields["error"] for r in caplog.records)


def test_a_database_not_migrated_is_a_503_naming_postrelay_migrate(server_url, caplog):
    with throwaway_database(server_url) as url, serve_database(url, SERVICE_KEY) as base:
        assert _database_up(base) == 0
        for headers in ({"apikey": SOME_KEY}, {"apikey": SERVICE_KEY}):
            response = httpx.get(f"{base}/v1/functions/jobs", headers=headers, timeout=30)
            err = error(response, 503)
            assert err["code"] == "not_ready" and "`postrelay migrate`" in err["message"], err
            assert "aa_" not in err["message"]  # the missing table is the log's
    _no_traceback(caplog)
