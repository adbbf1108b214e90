"""Migration 0027 on populated feedback: signed-link unsubscribes on record are matched by
their token (not those of a deleted tenant, nor one that claimed a row of another
recipient); unspecific permanent failures are given whether they named a message sent to
their recipient."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.engine import Engine

from postrelay.core.migrate import downgrade, upgrade
from tests.migrations import insert_tenant_and_sent_row, schema_diff


def test_0027_matches_signed_link_unsubscribes_and_counts_unspecific_bounces(
        empty_url: str, empty_engine: Engine) -> None:
    tenant, log = uuid.uuid4(), uuid.uuid4()
    upgrade(empty_url, "0026")
    with empty_engine.begin() as conn:
        insert_tenant_and_sent_row(conn, tenant, log)
        conn.execute(text(
            "INSERT INTO mdm.aa_email_feedback (tenant_id, email_log_id, matched_by, "
            "recipient, kind, status, source, dedupe_key, detail) VALUES "
            "(:t, NULL, NULL, 'ann@example.com', 'unsubscribe', NULL, 'one-click', 'click', "
            " '{}'), "
            "(:t, NULL, NULL, 'ann@example.com', 'unsubscribe', NULL, 'mail', 'mailto', '{}'), "
            "(NULL, NULL, NULL, 'ann@example.com', 'unsubscribe', NULL, 'one-click', 'gone', "
            " '{\"tenant_gone\": \"x\"}'), "
            "(:t, NULL, NULL, 'bob@example.com', 'unsubscribe', NULL, 'mail', 'claimed', "
            " '{\"claimed_log_id\": \"x\"}'), "
            "(:t, NULL, NULL, 'ann@example.com', 'unsubscribe', NULL, 'postmark', 'pm', '{}'), "
            "(:t, :l, 'verp', 'ann@example.com', 'bounced', '5.0.0', 'mail', 'vague', '{}'), "
            "(:t, :l, 'verp', 'bob@example.com', 'bounced', '5.3.0', 'mail', 'vague-bob', "
            " '{}'), "
            "(:t, :l, 'verp', 'ann@example.com', 'bounced', '5.1.1', 'mail', 'hard', '{}')"),
            {"t": tenant, "l": log})
    upgrade(empty_url)  # through 0027; the schema is compared with the models at the head
    with empty_engine.connect() as conn:
        assert schema_diff(conn) == []
        kept = {key: (matched_by, sent_to) for key, matched_by, sent_to in conn.execute(text(
            "SELECT dedupe_key, matched_by, sent_to FROM mdm.aa_email_feedback"))}
    assert kept == {"click": ("token", None), "mailto": ("token", None), "gone": (None, None),
                    "claimed": (None, None), "pm": (None, None), "vague": ("verp", True),
                    "vague-bob": ("verp", False), "hard": ("verp", None)}
    downgrade(empty_url, "0026")
    with empty_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_email_feedback "
                                 "WHERE matched_by = 'token'")).scalar() == 0
