"""Record one piece of feedback, with every effect, in the caller's transaction.

    with engine.begin() as conn:
        done = record_feedback(conn, Feedback(kind="bounced", source="mail",
                                              recipient="ann@example.com", status="5.1.1",
                                              log_id=token_log_id))
    done.suppressed, done.event_type          # True, "email.bounced"

`record_many` does the same for a batch (a provider's webhook delivery) in fewer round trips.

In order: match the log row (VERP token, Message-ID, queue id); insert the feedback row,
which stops here when the same feedback was recorded before; raise the log row's delivery
outcome, resolve an `unknown` row (and complete its held job), suppress when the rules
say so; emit the outbox event. Nothing is committed here: the caller's commit makes all of
it happen or none of it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

import postrelay.relay as relay
from postrelay.core import jsontext
from postrelay.core.telemetry import event as log_event
from postrelay.orchestrator.feedback import queries
from postrelay.orchestrator.feedback.model import (
    DELIVERY,
    EVENTS,
    Feedback,
    Recorded,
    SuppressionPolicy,
    suppresses,
)
from postrelay.orchestrator.schema import DELIVERY_OUTCOMES

DEFAULT_POLICY = SuppressionPolicy()


def record_feedback(conn: Connection, feedback: Feedback,
                    policy: SuppressionPolicy = DEFAULT_POLICY) -> Recorded:
    """Record `feedback` and apply its effects in the caller's transaction (never
    committed here). The same feedback a second time changes nothing and returns
    `Recorded(duplicate=True)`."""
    return record_many(conn, [feedback], policy)[0]


def record_many(conn: Connection, reports: Sequence[Feedback],
                policy: SuppressionPolicy = DEFAULT_POLICY) -> list[Recorded]:
    """`record_feedback` for each report, in order, in the caller's transaction: the same
    rules and effects, in fewer round trips (one match for the batch, one write of its
    outbox events). A report later in the batch sees what earlier ones did (a duplicate,
    a soft bounce counted)."""
    if not reports:
        return []
    matches = queries.email_feedback_match_many(
        conn, log_ids=[_text(f.log_id) for f in reports],
        message_ids=[f.message_id for f in reports], queue_ids=[f.queue_id for f in reports],
        recipients=[f.recipient for f in reports])
    done: list[Recorded] = []
    events: list[tuple[str, relay.EventSpec]] = []
    for feedback, match in zip(reports, matches, strict=True):
        recorded, spec = _record_one(conn, feedback, match, policy)
        done.append(recorded)
        if spec is not None:
            events.append((f"feedback:{feedback.source}", spec))
    _emit(conn, events)
    return done


def _record_one(conn: Connection, feedback: Feedback, match: dict[str, Any] | None,
                policy: SuppressionPolicy) -> tuple[Recorded, relay.EventSpec | None]:
    recipient = feedback.recipient
    if match is not None and recipient is None and len(match["recipients"]) == 1:
        # Complaint reports often withhold the recipient; a message to one address names it.
        recipient = match["recipients"][0]
    tenant_id = match["tenant_id"] if match else feedback.tenant_id
    # A report names a message postrelay sent to this recipient, or an unsubscribe token
    # postrelay signed names the recipient: only then may it suppress. Anything else may
    # be forged, and is recorded for an operator without effect on the address.
    sent_to = match is not None and recipient is not None and recipient in match["recipients"]
    trusted = sent_to or feedback.vouched
    # The log row takes the report's word when the report names a recipient of it, or came
    # back to the signed VERP address (which only postrelay can make).
    about_row = match is not None and (sent_to or match["matched_by"] == "verp")
    detail = dict(feedback.detail)
    if match is not None and not about_row:
        # Kept unmatched: the report names this row, but not a recipient it had.
        detail["claimed_log_id"] = str(match["id"])
        match = None
    inserted = queries.email_feedback_insert(
        conn, tenant_id=_text(tenant_id), email_log_id=_text(match["id"] if match else None),
        matched_by=match["matched_by"] if match else None, recipient=recipient,
        kind=feedback.kind, status=feedback.status, diagnostic=feedback.diagnostic,
        source=feedback.source, source_event_id=feedback.source_event_id,
        dedupe_key=feedback.dedupe_key(), detail=jsontext.encode(detail),
        occurred_at=feedback.occurred_at, soft_window_secs=policy.soft_window_secs)
    if inserted is None:
        log_event("postrelay.feedback.duplicate", logging.DEBUG, kind=feedback.kind,
                  source=feedback.source, source_event_id=feedback.source_event_id)
        return Recorded(feedback_id=None, duplicate=True,
                        email_log_id=match["id"] if match else None, tenant_id=tenant_id,
                        matched_by=match["matched_by"] if match else None), None
    feedback_id: UUID = inserted["id"]

    suppress = trusted and tenant_id is not None and (
        suppresses(feedback.kind, feedback.status)
        or (feedback.kind == "soft-bounced" and inserted["soft_before"] + 1 >= policy.soft_limit))
    category = (feedback.category or (match or {}).get("category") or "") \
        if feedback.kind == "unsubscribe" else ""
    applied = queries.email_feedback_apply(
        conn, email_log_id=_text(match["id"] if match else None),
        feedback_id=str(feedback_id), delivery=DELIVERY.get(feedback.kind),
        ranks=list(DELIVERY_OUTCOMES), tenant_id=_text(tenant_id), recipient=recipient,
        category=category, reason=_reason(feedback), source=feedback.source,
        status=feedback.status, suppress=bool(suppress))

    event_type = EVENTS.get(feedback.kind) if about_row or feedback.vouched else None
    spec = None
    if event_type is not None and tenant_id is not None:  # a matched row's or vouched one's
        spec = relay.EventSpec(
            event_type, _payload(feedback, feedback_id, match, recipient,
                                 applied["suppressed"], category),
            tenant_id=tenant_id, aggregate_type="email",
            aggregate_id=str(match["id"]) if match else str(recipient))
    done = Recorded(
        feedback_id=feedback_id, duplicate=False,
        email_log_id=match["id"] if match else None, tenant_id=tenant_id,
        matched_by=match["matched_by"] if match else None, suppressed=applied["suppressed"],
        resolved_unknown=applied["old_status"] == "unknown",
        completed_job=applied["completed_job"], event_type=event_type)
    log_event(f"postrelay.feedback.{feedback.kind}",
              logging.INFO if match else logging.WARNING, feedback_id=str(feedback_id),
              source=feedback.source, matched_by=done.matched_by, recipient=recipient,
              status=feedback.status, suppressed=done.suppressed,
              completed_job=str(done.completed_job) if done.completed_job else None)
    return done, spec


def _emit(conn: Connection, events: list[tuple[str, relay.EventSpec]]) -> None:
    """The batch's outbox events: one COPY per run of one source, one INSERT for a single
    event (cheaper than a COPY)."""
    if len(events) == 1:
        created_by, e = events[0]
        relay.emit(conn, e.event_type, e.payload, tenant_id=e.tenant_id,
                   aggregate_type=e.aggregate_type, aggregate_id=e.aggregate_id,
                   created_by=created_by)
        return
    start = 0
    while start < len(events):
        created_by = events[start][0]
        end = start
        while end < len(events) and events[end][0] == created_by:
            end += 1
        relay.emit_many(conn, [e for _, e in events[start:end]], created_by=created_by)
        start = end


def _payload(feedback: Feedback, feedback_id: UUID, match: dict[str, Any] | None,
             recipient: str | None, suppressed: bool, category: str) -> dict[str, Any]:
    return {
        "feedback_id": str(feedback_id), "kind": feedback.kind,
        "permanent": feedback.kind != "soft-bounced", "recipient": recipient,
        "status": feedback.status, "diagnostic": feedback.diagnostic,
        "source": feedback.source, "suppressed": suppressed,
        "category": category or (match or {}).get("category"),
        "email_log_id": _text(match["id"]) if match else None,
        "job_id": _text(match["job_id"]) if match else None,
        "message_id": match["message_id"] if match else None,
        "template": match["template"] if match else None,
    }


def _reason(feedback: Feedback) -> str:
    words = [feedback.kind, feedback.status or "", f"({feedback.source})"]
    if feedback.diagnostic:
        words.append(feedback.diagnostic[:500])
    return " ".join(w for w in words if w)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
