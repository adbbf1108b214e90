"""One thin typed function per statement of `sql/feedback.sql`."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from postrelay.core.sqlfiles import load_queries

FEEDBACK_SQL = load_queries("postrelay.orchestrator", "sql/feedback.sql")


def email_feedback_match_many(conn: Connection, *, log_ids: list[str | None],
                              message_ids: list[str | None], queue_ids: list[str | None],
                              recipients: list[str | None]) -> list[dict[str, Any] | None]:
    """The matched log row of each report, in order; None where nothing matched."""
    rows = conn.execute(FEEDBACK_SQL["email_feedback_match_many"], {
        "log_ids": log_ids, "message_ids": message_ids, "queue_ids": queue_ids,
        "recipients": recipients}).mappings().all()
    return [dict(r) if r["id"] is not None else None for r in rows]


def email_feedback_insert(conn: Connection, **row: Any) -> dict[str, Any] | None:
    """The new row's id, received_at and soft_before; None when it was recorded before."""
    inserted = conn.execute(FEEDBACK_SQL["email_feedback_insert"], row).mappings().first()
    return dict(inserted) if inserted else None


def email_feedback_apply(conn: Connection, **params: Any) -> dict[str, Any]:
    return dict(conn.execute(FEEDBACK_SQL["email_feedback_apply"], params).mappings().one())


def email_feedback_list(conn: Connection, **filters: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(FEEDBACK_SQL["email_feedback_list"], filters).mappings()]


def email_suppression_lift(conn: Connection, *, tenant_id: str, address: str,
                           actor: str) -> int:
    """How many rows were lifted (0: the address was not suppressed; nothing audited)."""
    return int(conn.execute(FEEDBACK_SQL["email_suppression_lift"], {
        "tenant_id": tenant_id, "address": address, "actor": actor}).scalar_one())


def email_suppression_audit_list(conn: Connection, **params: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(FEEDBACK_SQL["email_suppression_audit_list"],
                                          params).mappings()]

