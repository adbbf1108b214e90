"""In Chromium: the overview open while its database goes away says that the database is
unavailable, not that the server cannot be reached (the server still answers: 503)."""

from __future__ import annotations

from sqlalchemy import create_engine, text

from postrelay.core.db import sqlalchemy_url
from postrelay.core.migrate import upgrade
from tests.api.server import UNTHROTTLED, serve_database
from tests.dashboard.conftest import SERVICE_KEY, browser_sign_in
from tests.migrations import throwaway_database


def test_the_live_overview_says_the_database_is_unavailable(browser, server_url):
    with throwaway_database(server_url) as url, \
            serve_database(url, SERVICE_KEY, **UNTHROTTLED) as dash:
        upgrade(url)
        context = browser.new_context(base_url=dash)
        context.set_default_timeout(20_000)
        page = context.new_page()
        try:
            browser_sign_in(page)
            page.locator("#live-text", has_text="updated").wait_for()
            admin = create_engine(sqlalchemy_url(server_url), isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:  # the database goes away under the open page
                conn.execute(text(
                    f'DROP DATABASE "{sqlalchemy_url(url).database}" WITH (FORCE)'))
            admin.dispose()
            page.locator("#live-text", has_text="Database unavailable").wait_for()
            assert page.locator("#live").get_attribute("data-state") == "error"
        finally:
            context.close()
