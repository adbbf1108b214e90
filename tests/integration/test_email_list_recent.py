"""The email log with no tenant, status or recipient filter (`postrelay emails`, the API
with the service key): the newest rows of the whole log, paged, as the plain query over
the log answers it, the rows of a tenant deleted since among them."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text

from postrelay.core.clock import utcnow
from postrelay.orchestrator import email_list
from postrelay.queue import ensure_tenant

ROW = """
INSERT INTO mdm.aa_email_log (tenant_id, template, from_address, recipients, to_addresses,
                              message_id, status, attempt, created_at)
VALUES (:tenant, :template, 'noreply@example.com', ARRAY['a@example.com'],
        ARRAY['a@example.com'], :mid, 'sent', 1, :at)
"""

REFERENCE = """
SELECT id FROM mdm.aa_email_log
WHERE (CAST(:template AS text) IS NULL OR template = :template)
  AND (CAST(:since AS timestamptz) IS NULL OR created_at >= CAST(:since AS timestamptz))
ORDER BY created_at DESC, id DESC
LIMIT :limit OFFSET :offset
"""


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
                # The same times twice, so the id breaks ties.
                "at": now - timedelta(minutes=n // 2)})
    for template in (None, "receipt"):
        for since in (None, now - timedelta(minutes=10)):
            for limit, offset in ((7, 0), (7, 7), (5, 22), (100, 0)):
                with engine.connect() as conn:
                    got = [r["id"] for r in email_list(
                        conn, template=template, since=since, limit=limit, offset=offset)]
                    expected = list(conn.execute(text(REFERENCE), {
                        "template": template, "since": since, "limit": limit,
                        "offset": offset}).scalars())
                assert got == expected, (template, since, limit, offset)
    with engine.connect() as conn:
        listed = email_list(conn, limit=100)
    assert len(listed) == 45
    assert sum(r["tenant_id"] == gone for r in listed) == 15
