"""One thin typed function per statement of `sql/feedback.sql`. Those of `record_many` are
steps (`core.dbcall`): the same logic runs on a sync connection and on the inbound
receiver's async one."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from postrelay.core import jsontext
from postrelay.core.dbcall import Steps
from postrelay.core.sqlfiles import load_queries

FEEDBACK_SQL = load_queries("postrelay.orchestrator", "sql/feedback.sql")


def email_feedback_match_many(keys: list[dict[str, Any]]
                              ) -> Steps[list[tuple[dict[str, Any] | None, bool]]]:
    """Per report, in order: its matched log row (None where nothing matched) and whether
    its tenant has been deleted. `keys`: per report, its log_id, message_id, queue_id,
    recipient, original_recipient and tenant_id."""
    rows = yield FEEDBACK_SQL["email_feedback_match_many"], {
        "rows": jsontext.encode_rows(keys)}
    return [(r._asdict() if r.id is not None else None, r.tenant_gone) for r in rows]


def email_feedback_lock(*, clicks: list[str], soft: list[str]) -> Steps[None]:
    """Wait for the transactions recording an unsubscribe through a signed link (`clicks`)
    or a soft bounce that counts (`soft`) of these keys (`tenant address`); held until this
    one ends."""
    yield FEEDBACK_SQL["email_feedback_lock"], {"clicks": clicks, "soft": soft}


def email_hour_mark_lock() -> Steps[None]:
    """Wait for a running email hour tally round to finish; held until this transaction
    ends, so none starts meanwhile (email_feedback_apply_many)."""
    yield FEEDBACK_SQL["email_hour_mark_lock"], {}


def email_feedback_insert_many(rows: list[dict[str, Any]], *, soft_window_secs: float
                               ) -> Steps[dict[str, dict[str, Any]]]:
    """The new rows' id and soft_before by dedupe_key; a row recorded before is absent."""
    if not rows:
        return {}
    result = yield FEEDBACK_SQL["email_feedback_insert_many"], {
        "rows": jsontext.encode_rows(rows), "soft_window_secs": float(soft_window_secs)}
    return {r.dedupe_key: r._asdict() for r in result}


def email_feedback_apply_many(rows: list[dict[str, Any]], *, ranks: str
                              ) -> Steps[list[dict[str, Any]]]:
    """Per row, in order: old_status (the log row's, for the first report about it),
    completed_job and suppressed. `ranks`: the delivery outcomes in rank order, as an array
    literal (`{a,b}`)."""
    if not rows:
        return []
    result = yield FEEDBACK_SQL["email_feedback_apply_many"], {
        "rows": jsontext.encode_rows(rows), "ranks": ranks}
    return [r._asdict() for r in result]


def email_feedback_list(conn: Connection, **filters: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(FEEDBACK_SQL["email_feedback_list"], filters).mappings()]


def email_suppression_lift(conn: Connection, *, tenant_id: str, address: str,
                           category: str, actor: str) -> tuple[bool, list[str]]:
    """Whether the category's row was lifted (else nothing was audited), and the address's
    other categories still suppressed."""
    # After the transactions recording the address's soft bounces or signed-link
    # unsubscribes now: one counted before the lift (a soft bounce reaching the limit)
    # would otherwise suppress again once it has gone.
    key = f"{UUID(str(tenant_id))} {address}"
    conn.execute(FEEDBACK_SQL["email_feedback_lock"], {"clicks": [key], "soft": [key]})
    lifted, others = conn.execute(FEEDBACK_SQL["email_suppression_lift"], {
        "tenant_id": tenant_id, "address": address, "category": category,
        "actor": actor}).one()
    return bool(lifted), list(others)


def email_suppression_audit_list(conn: Connection, **params: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(FEEDBACK_SQL["email_suppression_audit_list"],
                                          params).mappings()]

