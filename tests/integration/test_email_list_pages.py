"""The email log's lists that page through the whole log (dashboard, `postrelay emails`,
the API): in one status (the SMTP outcome or a late bounce) and with no tenant, status or
recipient filter, newest first, paged, as the plain query over the log answers it, without
reading every such row of a long log."""

from __future__ import annotations

import json
from datetime import timedelta

from sqlalchemy import text

from postrelay.core.clock import utcnow
from postrelay.orchestrator import email_list
from postrelay.orchestrator.queries import EMAIL_SQL
from postrelay.queue import ensure_tenant

ROW = """
INSERT INTO mdm.aa_email_log (tenant_id, template, from_address, recipients, to_addresses,
                              message_id, status, delivery, attempt, created_at)
VALUES (:tenant, :template, 'noreply@example.com', ARRAY['a@example.com'],
        ARRAY['a@example.com'], :mid, :status, :delivery, 1, :at)
"""

REFERENCE = """
SELECT id FROM mdm.aa_email_log
WHERE (CAST(:status AS text) IS NULL OR status = :status OR delivery = :status)
  AND (CAST(:tenant AS uuid) IS NULL OR tenant_id = CAST(:tenant AS uuid))
  AND (CAST(:template AS text) IS NULL OR template = :template)
  AND (CAST(:since AS timestamptz) IS NULL OR created_at >= CAST(:since AS timestamptz))
ORDER BY created_at DESC, id DESC
LIMIT :limit OFFSET :offset
"""
PAGES = ((7, 0), (7, 7), (5, 22), (100, 0))


def assert_pages_as_reference(engine, *, status=None, tenant=None, template=None,
                              since=None):
    """email_list's pages for these filters are the reference query's."""
    for limit, offset in PAGES:
        with engine.connect() as conn:
            got = [r["id"] for r in email_list(
                conn, status=status, tenant_id=tenant, template=template, since=since,
                limit=limit, offset=offset)]
            expected = list(conn.execute(text(REFERENCE), {
                "status": status, "tenant": tenant, "template": template, "since": since,
                "limit": limit, "offset": offset}).scalars())
        assert got == expected, (status, tenant, template, since, limit, offset)


def test_a_status_lists_outcomes_and_late_feedback_merged_newest_first(engine, tenant):
    now = utcnow()
    with engine.begin() as conn:
        other = ensure_tenant(conn, "globex")
        for n in range(60):
            # Bounced at once, sent then bounced late, sent, deferred then delivered; the
            # same times twice, so the id breaks ties.
            status, delivery = [("bounced", None), ("sent", "bounced"), ("sent", None),
                                ("deferred", "delivered"), ("bounced", "bounced")][n % 5]
            conn.execute(text(ROW), {
                "tenant": tenant if n % 3 else other, "template": "welcome" if n % 4 else "receipt",
                "mid": f"<{n}@x>", "status": status, "delivery": delivery,
                "at": now - timedelta(minutes=n // 2)})
    for status in ("bounced", "delivered", "sent", "failed"):
        for scope, template in ((None, None), (tenant, None), (None, "receipt")):
            assert_pages_as_reference(engine, status=status, tenant=scope, template=template)
    with engine.connect() as conn:
        assert len(email_list(conn, status="bounced", limit=100)) == 36  # 12 + 12 + 12


def test_a_status_page_reads_a_page_of_rows_not_all_of_them(engine, tenant):
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO mdm.aa_email_log (tenant_id, template, from_address, recipients,"
            " to_addresses, message_id, status, attempt, created_at)"
            " SELECT :t, 'welcome', 'noreply@example.com', ARRAY['a@example.com'],"
            " ARRAY['a@example.com'], '<' || g || '@x>', 'bounced', 1,"
            " :now - g * interval '1 minute' FROM generate_series(1, 20000) g"),
            {"t": tenant, "now": now})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE mdm.aa_email_log"))
    params = {"tenant_id": None, "recipient": None, "status": "bounced", "template": None,
              "event_id": None, "job_id": None, "since": None, "until": None, "limit": 51,
              "offset": 0}
    with engine.connect() as conn:
        conn.execute(text("SET plan_cache_mode = force_custom_plan"))
        plan = conn.execute(text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                                 + EMAIL_SQL["email_log_list_status"].text), params).scalar_one()
        pages = conn.execute(text("SELECT pg_relation_size('mdm.aa_email_log') / 8192")
                             ).scalar_one()
    plan = plan if isinstance(plan, list) else json.loads(plan)
    touched = plan[0]["Plan"]["Shared Hit Blocks"] + plan[0]["Plan"]["Shared Read Blocks"]
    assert pages > 300 and touched < 60, (touched, pages)


def test_the_whole_log_lists_every_tenants_rows_newest_first(engine, tenant):
    now = utcnow()
    with engine.begin() as conn:
        other = ensure_tenant(conn, "globex")
        gone = ensure_tenant(conn, "initech")
        # A tenant deleted since: the log keeps its rows (no foreign key), and so does
        # every list of it.
        conn.execute(text("DELETE FROM mdm.aa_tenant WHERE id = :id"), {"id": gone})
        for n in range(45):
            conn.execute(text(ROW), {
                "tenant": (tenant, other, gone)[n % 3],
                "template": "welcome" if n % 4 else "receipt", "mid": f"<{n}@x>",
                "status": "sent", "delivery": None, "at": now - timedelta(minutes=n // 2)})
    for template in (None, "receipt"):
        for since in (None, now - timedelta(minutes=10)):
            assert_pages_as_reference(engine, template=template, since=since)
    with engine.connect() as conn:
        listed = email_list(conn, limit=100)
    assert len(listed) == 45
    assert sum(r["tenant_id"] == gone for r in listed) == 15
