"""One thin typed function per statement of `sql/feedback.sql`."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from postrelay.core.sqlfiles import load_queries

FEEDBACK_SQL = load_queries("postrelay.orchestrator", "sql/feedback.sql")


def email_feedback_match(conn: Connection, **keys: Any) -> dict[str, Any] | None:
    row = conn.execute(FEEDBACK_SQL["email_feedback_match"], keys).mappings().first()
    return dict(row) if row else None


def email_feedback_insert(conn: Connection, **row: Any) -> dict[str, Any] | None:
    """The new row's id, received_at and soft_before; None when it was recorded before."""
    inserted = conn.execute(FEEDBACK_SQL["email_feedback_insert"], row).mappings().first()
    return dict(inserted) if inserted else None


def email_feedback_apply(conn: Connection, **params: Any) -> dict[str, Any]:
    return dict(conn.execute(FEEDBACK_SQL["email_feedback_apply"], params).mappings().one())


def email_feedback_list(conn: Connection, **filters: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(FEEDBACK_SQL["email_feedback_list"], filters).mappings()]

