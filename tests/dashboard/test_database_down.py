"""The dashboard while its database cannot be reached, or is behind the code's migrations:
every page, fragment and form is a 503 page that says so (with Retry-After), logged as a
warning, never a 500 and a logged error; the sign-in form with a tenant key too."""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from tests.api.server import UNTHROTTLED, serve_database
from tests.dashboard.conftest import PAGES, SERVICE_KEY, login_token, sign_in
from tests.migrations import throwaway_database


@pytest.fixture
def down_url(database_url: str) -> Iterator[str]:
    """A dashboard (with the API) whose database URL names a port where nothing listens: a
    socket bound there and never listening refuses every connection."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        parts = urlsplit(database_url)
        netloc = parts.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{hole.getsockname()[1]}"
        with serve_database(urlunsplit(parts._replace(netloc=netloc)), SERVICE_KEY,
                            **UNTHROTTLED) as url:
            yield url


def unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, (response.request.url, response.text[:300])
    assert response.headers["retry-after"].isdigit()
    assert "Database unavailable" in response.text
    assert "cannot be reached" in response.text


def test_every_page_and_form_is_a_503_page_while_the_database_is_down(
        down_url, dash_url, acme_key, caplog):
    with httpx.Client(base_url=down_url, timeout=30) as service:
        sign_in(service, SERVICE_KEY)  # the service-role key is checked without the database
        for path in [*PAGES, "/dashboard/pauses", "/dashboard/jobs/00000000-0000-0000-0000-"
                     "000000000001", "/dashboard/emails/00000000-0000-0000-0000-000000000001"]:
            unavailable(service.get(path))
        unavailable(service.get("/dashboard/panels", headers={"x-dashboard-fragment": "1"}))
    # A tenant session is re-checked against its key on every request, and a tenant key
    # is looked up to sign in: both need the database. (The session is made by a dashboard
    # on the live database; both dashboards sign with the same service-role key.)
    with httpx.Client(base_url=dash_url, timeout=30) as live:
        sign_in(live, acme_key)
        page = live.get("/dashboard/dlq").text
        token = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
        cookies = dict(live.cookies)
    with httpx.Client(base_url=down_url, timeout=30, cookies=cookies) as tenant:
        unavailable(tenant.get("/dashboard/"))
        unavailable(tenant.post("/dashboard/dlq/apply", data={
            "csrf": token, "action": "retry", "ids": "00000000-0000-0000-0000-000000000001"}))
    with httpx.Client(base_url=down_url, timeout=30) as stranger:
        unavailable(stranger.post("/dashboard/login", data={
            "csrf": login_token(stranger), "key": acme_key, "next": "/"}))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert any("postrelay.dashboard.database_unavailable" in r.getMessage()
               for r in caplog.records)


def test_a_database_not_migrated_is_a_503_page_that_says_to_migrate(server_url, caplog):
    with throwaway_database(server_url) as empty, \
            serve_database(empty, SERVICE_KEY, **UNTHROTTLED) as url, \
            httpx.Client(base_url=url, timeout=30) as client:
        sign_in(client, SERVICE_KEY)
        for path in [*PAGES, "/dashboard/pauses"]:
            response = client.get(path)
            assert response.status_code == 503, (path, response.text[:300])
            assert "Database not migrated" in response.text
            assert "Run `postrelay migrate`" in response.text
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
