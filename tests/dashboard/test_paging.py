"""Paging through a long listing: the last page the dashboard pages to says so instead of
offering an "Older" link that shows the same page again."""

from __future__ import annotations

import re

from sqlalchemy import text

from postrelay.dashboard.queries import MAX_PAGE, PAGE_SIZE


def test_the_last_page_offers_no_older_link_that_loops(admin, engine, tenant):
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO mdm.aa_job (tenant_id, job_kind, status, payload, completed_at)"
            " SELECT :tenant, 'reindex', 'done', '{}', now() - make_interval(secs => i)"
            " FROM generate_series(1, :n) AS i"), {"tenant": tenant, "n": MAX_PAGE * PAGE_SIZE + 1})
    before_last = admin.get("/dashboard/jobs", params={"status": "done", "page": MAX_PAGE - 1})
    assert f"page={MAX_PAGE}" in before_last.text and "Older" in before_last.text
    last = admin.get("/dashboard/jobs", params={"status": "done", "page": MAX_PAGE})
    assert last.status_code == 200
    assert f"page={MAX_PAGE + 1}" not in last.text and "Older →" not in last.text
    assert "narrow the time range for older ones" in last.text
    assert re.search(rf"page {MAX_PAGE}\b", last.text)
