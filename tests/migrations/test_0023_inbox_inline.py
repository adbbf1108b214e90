"""Migration 0023 on a populated inbox: its rows stay in place up to a page's size, as they
come (toast_tuple_target), and a downgrade puts the server's default back."""

from __future__ import annotations

from sqlalchemy import Connection, text
from sqlalchemy.engine import Engine

from postrelay.core.migrate import downgrade, upgrade
from tests.migrations import schema_diff


def _options(conn: Connection) -> list[str]:
    return list(conn.execute(text(
        "SELECT coalesce(reloptions, '{}') FROM pg_class "
        "WHERE oid = 'mdm.aa_feedback_inbox'::regclass")).scalar_one())


def _stored(conn: Connection) -> tuple[int, bool]:
    """The inbox's raw value as stored: its size and whether it was compressed."""
    stored, length = conn.execute(text(
        "SELECT pg_column_size(raw), octet_length(raw) FROM mdm.aa_feedback_inbox "
        "ORDER BY id DESC LIMIT 1")).one()
    return length, stored < length


def test_0023_keeps_inbox_rows_inline_and_back(empty_url: str, empty_engine: Engine) -> None:
    bounce = b"Reporting-MTA: dns; mx.example.net\r\n" * 120  # 4 kB that compress well
    insert = text("INSERT INTO mdm.aa_feedback_inbox (envelope_to, raw) "
                  "VALUES (ARRAY['bounce-x@bounces.example'], :raw)")
    upgrade(empty_url, "0022")
    with empty_engine.begin() as conn:
        conn.execute(insert, {"raw": bounce})
        assert _stored(conn) == (len(bounce), True)  # compressed on the way in
    upgrade(empty_url, "0023")
    with empty_engine.begin() as conn:
        assert _options(conn) == ["toast_tuple_target=8160"]
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_feedback_inbox")).scalar() == 1
        conn.execute(insert, {"raw": bounce})
        assert _stored(conn) == (len(bounce), False)  # as it came
    upgrade(empty_url, "head")
    with empty_engine.connect() as conn:
        assert schema_diff(conn) == []
    downgrade(empty_url, "0022")
    with empty_engine.connect() as conn:
        assert _options(conn) == []
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_feedback_inbox")).scalar() == 2
