"""Operator views of feedback (the CLI `postrelay feedback list`) and of lifted
suppressions (`postrelay emails suppressed --lifted`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from postrelay.core.errors import ValidationError
from postrelay.orchestrator.admin import MAX_LIMIT, _uuid, address_filter
from postrelay.orchestrator.feedback import queries
from postrelay.orchestrator.feedback.model import SOURCES
from postrelay.orchestrator.schema import FEEDBACK_KINDS


def feedback_list(conn: Connection, *, tenant_id: UUID | str | None = None,
                  kind: str | None = None, source: str | None = None,
                  since: datetime | None = None, unmatched: bool = False,
                  limit: int = 100) -> list[dict[str, Any]]:
    """Feedback received since `since`, newest first, matching every filter given;
    `unmatched` keeps only what no log row took."""
    if kind is not None and kind not in FEEDBACK_KINDS:
        raise ValidationError("kind", f"must be one of {', '.join(FEEDBACK_KINDS)}")
    if source is not None and source not in SOURCES:
        raise ValidationError("source", f"must be one of {', '.join(SOURCES)}")
    if not 1 <= limit <= MAX_LIMIT:
        raise ValidationError("limit", f"must be between 1 and {MAX_LIMIT}")
    return queries.email_feedback_list(conn, tenant_id=_uuid("tenant", tenant_id), kind=kind,
                                       source=source, since=since, unmatched=unmatched,
                                       limit=limit)


def suppression_audit(conn: Connection, *, tenant_id: UUID | str | None = None,
                      address: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Lifted suppressions, newest first: who lifted what, when."""
    if not 1 <= limit <= MAX_LIMIT:
        raise ValidationError("limit", f"must be between 1 and {MAX_LIMIT}")
    return queries.email_suppression_audit_list(
        conn, tenant_id=_uuid("tenant", tenant_id),
        address=address_filter("address", address), limit=limit)

