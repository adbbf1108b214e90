"""Feedback in figures, for `/metrics` and the dashboard: what was received by kind and
source, the inbound receiver's inbox backlog, and each tenant's bounce and complaint rates
over 24 hours and 7 days (each window from a whole UTC hour; the week's answered messages
mostly from the email hour tally: orchestrator/email_hours.py).

    feedback_rates(conn, tenant_id=None)
    # [{"tenant_id": ..., "tenant_name": "acme", "messages_24h": 120, "bounced_24h": 3,
    #   "bounce_rate_24h": 0.025, "complaint_rate_24h": 0.0, ... "_7d": ...}]
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from postrelay.orchestrator.admin import _uuid
from postrelay.orchestrator.feedback.queries import FEEDBACK_SQL
from postrelay.orchestrator.queries import EMAIL_SQL

WINDOWS = ("24h", "7d")


def feedback_counts(conn: Connection, *, now: datetime | None = None,
                    within: timedelta = timedelta(hours=24)) -> list[dict[str, Any]]:
    """Feedback received within `within` before `now`, by kind and source."""
    since = (now or datetime.now(UTC)) - within
    return [dict(r) for r in conn.execute(FEEDBACK_SQL["email_feedback_counts"],
                                          {"since": since}).mappings()]


def inbox_backlog(conn: Connection) -> dict[str, Any]:
    """Mail `postrelay inbound` accepted and has not recorded yet: `waiting` messages, the
    oldest `oldest_age_secs` old (None when none waits)."""
    return dict(conn.execute(FEEDBACK_SQL["feedback_inbox_backlog"]).mappings().one())


def feedback_rates(conn: Connection, *, tenant_id: UUID | str | None = None,
                   now: datetime | None = None) -> list[dict[str, Any]]:
    """Each tenant's messages, bounces and complaints over the last 24 hours and 7 days,
    with the rates (None when no message got an answer in the window)."""
    until = conn.execute(EMAIL_SQL["email_hour_rollup_until"]).scalar_one()
    rows = conn.execute(FEEDBACK_SQL["email_feedback_rates"], {
        "now": now or datetime.now(UTC), "until": until,
        "tenant_id": _uuid("tenant", tenant_id)}).mappings()
    found = []
    for row in rows:
        item = dict(row)
        for window in WINDOWS:
            sent = item[f"messages_{window}"]
            item[f"bounce_rate_{window}"] = item[f"bounced_{window}"] / sent if sent else None
            item[f"complaint_rate_{window}"] = \
                item[f"complained_{window}"] / sent if sent else None
        found.append(item)
    return found
