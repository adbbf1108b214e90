"""Migration 0026 on populated feedback: the soft bounces on record are given whether they
named a message sent to their recipient, from the log as it is; other kinds are left
unset, and a downgrade drops the column."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.engine import Engine

from postrelay.core.migrate import downgrade, upgrade
from tests.migrations import insert_tenant_and_sent_row, schema_diff


def test_0026_keeps_on_each_soft_bounce_whom_it_names(empty_url: str,
                                                     empty_engine: Engine) -> None:
    tenant, log = uuid.uuid4(), uuid.uuid4()
    upgrade(empty_url, "0025")
    with empty_engine.begin() as conn:
        insert_tenant_and_sent_row(conn, tenant, log)
        # Soft bounces: about ann's message; naming bob, whom it was not sent to; about a
        # row retention deleted; and a hard bounce, which nothing counts.
        conn.execute(text(
            "INSERT INTO mdm.aa_email_feedback (tenant_id, email_log_id, recipient, kind, "
            "source, dedupe_key) VALUES "
            "(:t, :l, 'ann@example.com', 'soft-bounced', 'mail', 'ann'), "
            "(:t, :l, 'bob@example.com', 'soft-bounced', 'mail', 'bob'), "
            "(:t, :gone, 'ann@example.com', 'soft-bounced', 'mail', 'gone'), "
            "(:t, :l, 'ann@example.com', 'bounced', 'mail', 'hard')"),
            {"t": tenant, "l": log, "gone": uuid.uuid4()})
    upgrade(empty_url)  # through 0026; the schema is compared with the models at the head
    with empty_engine.connect() as conn:
        assert schema_diff(conn) == []
        kept = dict(conn.execute(text(
            "SELECT dedupe_key, sent_to FROM mdm.aa_email_feedback")).all())
    assert kept == {"ann": True, "bob": False, "gone": False, "hard": None}
    downgrade(empty_url, "0025")
    with empty_engine.connect() as conn:
        assert conn.execute(text(
            "SELECT count(*) FROM information_schema.columns WHERE table_schema = 'mdm' "
            "AND table_name = 'aa_email_feedback' AND column_name = 'sent_to'")).scalar() == 0
