"""The email log in one status (dashboard, `postrelay emails --status`, the API): the SMTP
outcome or a late bounce, newest first, paged, as the plain `status = x OR delivery = x`
query answers it, without reading every such row of a long log."""

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
WHERE (status = :status OR delivery = :status)
  AND (CAST(:tenant AS uuid) IS NULL OR tenant_id = CAST(:tenant AS uuid))
  AND (CAST(:template AS text) IS NULL OR template = :template)
ORDER BY created_at DESC, id DESC
LIMIT :limit OFFSET :offset
"""


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
            for limit, offset in ((7, 0), (7, 7), (5, 22), (100, 0)):
                with engine.connect() as conn:
                    got = [r["id"] for r in email_list(
                        conn, status=status, tenant_id=scope, template=template, limit=limit,
                        offset=offset)]
                    expected = list(conn.execute(text(REFERENCE), {
                        "status": status, "tenant": scope, "template": template,
                        "limit": limit, "offset": offset}).scalars())
                assert got == expected, (status, scope, template, limit, offset)
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
