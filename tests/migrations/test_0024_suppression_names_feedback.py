"""Migration 0024 on populated feedback: the index by which readers find the suppression a
report made, and a downgrade that writes into the reports' own flags what the suppression
rows said, for the earlier readers that look at the flag alone."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.engine import Engine

from postrelay.core.migrate import downgrade, upgrade
from tests.migrations import schema_diff


def _index(conn) -> str | None:  # noqa: ANN001
    return conn.execute(text(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = 'mdm' "
        "AND indexname = 'ix_email_suppression_feedback'")).scalar()


def test_0024_indexes_the_reports_suppressions_and_back(empty_url: str,
                                                        empty_engine: Engine) -> None:
    tenant, flagged, standing, none = (uuid.uuid4() for _ in range(4))
    upgrade(empty_url, "0023")
    with empty_engine.begin() as conn:
        conn.execute(text("INSERT INTO mdm.aa_tenant (id, name) VALUES (:t, 'acme')"),
                     {"t": tenant})
        # Recorded before 0024: the flag set; and one whose suppression stands.
        conn.execute(text(
            "INSERT INTO mdm.aa_email_feedback (id, tenant_id, recipient, kind, source, "
            "dedupe_key, suppressed) VALUES (:a, :t, 'ann@example.com', 'bounced', 'mail', "
            "'a', true), (:b, :t, 'bob@example.com', 'bounced', 'mail', 'b', false), "
            "(:c, :t, 'cy@example.com', 'delayed', 'mail', 'c', false)"),
            {"a": flagged, "b": standing, "c": none, "t": tenant})
        conn.execute(text(
            "INSERT INTO mdm.aa_email_suppression (tenant_id, address, reason, source, "
            "feedback_id) VALUES (:t, 'bob@example.com', 'bounced 5.1.1', 'mail', :b)"),
            {"t": tenant, "b": standing})
    upgrade(empty_url, "0024")
    with empty_engine.connect() as conn:
        assert "WHERE (feedback_id IS NOT NULL)" in (_index(conn) or "")
    upgrade(empty_url)
    with empty_engine.connect() as conn:
        assert schema_diff(conn) == []
    downgrade(empty_url, "0023")
    with empty_engine.connect() as conn:
        assert _index(conn) is None
        flags = dict(conn.execute(text(
            "SELECT id, suppressed FROM mdm.aa_email_feedback")).all())
    assert flags == {flagged: True, standing: True, none: False}
