"""Record one piece of feedback, with every effect, in the caller's transaction.

    with engine.begin() as conn:
        done = record_feedback(conn, Feedback(kind="bounced", source="mail",
                                              recipient="ann@example.com", status="5.1.1",
                                              log_id=token_log_id))
    done.suppressed, done.event_type          # True, "email.bounced"

`record_many` does the same for a batch (a provider's webhook delivery, the mail of a group
commit) in four statements whatever its size (a lock before them when it holds soft
bounces or signed-link unsubscribes); `record_many_async` on an async connection.

In order: match the log row (VERP token, Message-ID, queue id); insert the feedback row,
which stops here when the same feedback was recorded before; raise the log row's delivery
outcome, resolve an `unknown` row (complete its held job, move it to `sent` in the email
hour tally), suppress when the rules say so; emit the outbox event. Nothing is committed
here: the caller's commit makes all of it happen or none of it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

import postrelay.relay as relay
from postrelay.core.dbcall import AsyncAnyConnection, Steps, run_async, run_sync
from postrelay.core.telemetry import event as log_event
from postrelay.orchestrator.feedback import queries
from postrelay.orchestrator.feedback.model import (
    DELIVERY,
    EVENTS,
    Feedback,
    Recorded,
    SuppressionPolicy,
    counts_as_soft,
    suppresses,
)
from postrelay.orchestrator.schema import DELIVERY_OUTCOMES

DEFAULT_POLICY = SuppressionPolicy()
_RANKS = "{" + ",".join(DELIVERY_OUTCOMES) + "}"


def record_feedback(conn: Connection, feedback: Feedback,
                    policy: SuppressionPolicy = DEFAULT_POLICY) -> Recorded:
    """Record `feedback` and apply its effects in the caller's transaction (never
    committed here). The same feedback a second time changes nothing and returns
    `Recorded(duplicate=True)`."""
    return record_many(conn, [feedback], policy)[0]


def record_many(conn: Connection, reports: Sequence[Feedback],
                policy: SuppressionPolicy = DEFAULT_POLICY) -> list[Recorded]:
    """`record_feedback` for each report, in order, in the caller's transaction: the same
    rules and effects as one after the other (a report later in the batch sees what
    earlier ones did: a duplicate, a soft bounce counted), in four statements whatever the
    batch's size: match, insert, apply, outbox events."""
    if not reports:
        return []
    results, events = run_sync(conn, _record_steps(reports, policy))
    _emit(conn, events)
    return results


async def record_many_async(conn: AsyncAnyConnection, reports: Sequence[Feedback],
                            policy: SuppressionPolicy = DEFAULT_POLICY) -> list[Recorded]:
    """`record_many` on an async SQLAlchemy or psycopg connection (the inbound receiver's
    event loop).

        async with engine.begin() as conn:
            done = await record_many_async(conn, reports, policy)
    """
    if not reports:
        return []
    results, events = await run_async(conn, _record_steps(reports, policy))
    if len(events) == 1:
        created_by, e = events[0]
        await relay.emit_async(conn, e.event_type, e.payload, tenant_id=e.tenant_id,
                               aggregate_type=e.aggregate_type, aggregate_id=e.aggregate_id,
                               created_by=created_by)
    else:
        for created_by, run in _runs(events):
            await relay.emit_many_async(conn, run, created_by=created_by)
    return results


Events = list[tuple[str, relay.EventSpec]]


def _record_steps(reports: Sequence[Feedback], policy: SuppressionPolicy
                  ) -> Steps[tuple[list[Recorded], Events]]:
    """The statements of a batch (match, insert, apply; a lock first when it holds
    signed-link unsubscribes or soft bounces that count); its results and the outbox
    events to emit."""
    matches = yield from queries.email_feedback_match_many(
        [{"log_id": f.log_id, "message_id": f.message_id, "queue_id": f.queue_id,
          "recipient": f.recipient, "original_recipient": f.original_recipient,
          "tenant_id": f.tenant_id} for f in reports])
    rows = [_Row.of(feedback, *found) for feedback, found in zip(reports, matches, strict=True)]
    if any(match is not None and match["status"] == "unknown" for match, _ in matches):
        # It may resolve an `unknown` row, which then moves in the email hour tally: the
        # apply statement's snapshot must see every tally round that ran before.
        yield from queries.email_hour_mark_lock()
    seen: set[Any] = set()
    fresh = []  # each dedupe_key once: a report repeated within the batch is a duplicate,
    clicked = set()  # and so is a second click on an address's link (the first one counts)
    soft = set()
    for row in rows:
        once: set[Any] = {row.dedupe_key}
        if (category := row.link_category()) is not None:
            once.add((row.tenant_id, row.recipient, category))
        if seen.isdisjoint(once):
            fresh.append(row)
            if category is not None:
                clicked.add(f"{row.tenant_id} {row.recipient}")
            if row.counts_soft():
                soft.add(f"{row.tenant_id} {row.recipient}")
        seen |= once
    # Clicks on one address's link made at once (a double click) take turns, so that the
    # insert of the second sees the suppression the first made; and so do soft bounces of
    # one address recorded at once (parallel webhook deliveries, two receivers), so that
    # each counts the others.
    if clicked or soft:
        yield from queries.email_feedback_lock(clicks=sorted(clicked), soft=sorted(soft))
    inserted = yield from queries.email_feedback_insert_many(
        [r.insert_params() for r in fresh], soft_window_secs=policy.soft_window_secs)
    recorded = [r for r in fresh if r.take_insert(inserted)]
    soft_seen: dict[tuple[Any, str | None], int] = {}
    for row in recorded:
        row.decide(policy, soft_seen)
    applied = yield from queries.email_feedback_apply_many(
        [r.apply_params() for r in recorded], ranks=_RANKS)
    events: Events = []
    for row, effect in zip(recorded, applied, strict=True):
        spec = row.take_effect(effect)
        if spec is not None:
            events.append((f"feedback:{row.feedback.source}", spec))
    return [row.result() for row in rows], events


class _Row:
    """One report on its way through record_many: what the match made of it, then what
    the insert and the apply did."""

    def __init__(self, feedback: Feedback, match: dict[str, Any] | None,
                 recipient: str | None, tenant_id: UUID | None, sent_to: bool,
                 about_row: bool, detail: dict[str, Any]) -> None:
        self.feedback = feedback
        self.match = match
        self.recipient = recipient
        self.tenant_id = tenant_id
        self.sent_to = sent_to
        self.about_row = about_row
        self.detail = detail
        self.dedupe_key = feedback.dedupe_key()
        self.feedback_id: UUID | None = None
        self.soft_before = 0
        self.suppress = False
        self.category = ""
        self.done: Recorded | None = None

    @classmethod
    def of(cls, feedback: Feedback, match: dict[str, Any] | None, tenant_gone: bool) -> _Row:
        recipient, detail = feedback.recipient, dict(feedback.detail)
        if match is not None and recipient is None and len(match["recipients"]) == 1:
            # Complaint reports often withhold the recipient; a message to one address
            # names it.
            recipient = match["recipients"][0]
        elif match is not None and feedback.original_recipient is not None and \
                recipient not in match["recipients"] and \
                feedback.original_recipient in match["recipients"]:
            # Sent to an alias that forwards: the address postrelay sends to is the one that
            # keeps failing, and the one to suppress.
            detail["final_recipient"] = recipient
            recipient = feedback.original_recipient
        elif match is not None and feedback.kind == "complaint" and recipient is not None \
                and recipient not in match["recipients"] and len(match["recipients"]) == 1 \
                and _domain(recipient) == _domain(match["recipients"][0]):
            # Feedback loops that redact the recipient (RFC 6590: Validity's for Comcast)
            # replace its local part with a hash and keep the domain: a message to one
            # address on that domain names it.
            detail["redacted_recipient"] = recipient
            recipient = match["recipients"][0]
        tenant_id = match["tenant_id"] if match else feedback.tenant_id
        if tenant_gone:
            # Mail of a tenant deleted since (late feedback, a link in an old message):
            # kept unmatched for an operator, as nothing can be suppressed or emitted for it.
            detail["tenant_gone"] = str(tenant_id)
            if match is not None:
                detail["claimed_log_id"] = str(match["id"])
            row = cls(feedback, None, recipient, None, False, False, detail)
            if feedback.vouched:
                # Each click on a signed link has an id of its own, and no suppression can
                # stand for a deleted tenant to leave the next one out: every click was a
                # row. Named by the link alone, the first is kept and the rest are it.
                row.dedupe_key = replace(feedback, source_event_id="tenant-gone").dedupe_key()
            return row
        # A report names a message postrelay sent to this recipient, or an unsubscribe
        # token postrelay signed names the recipient: only then may it suppress. Anything
        # else may be forged, and is recorded for an operator without effect on the address.
        sent_to = match is not None and recipient is not None and \
            recipient in match["recipients"]
        # The log row takes the report's word when the report names a recipient of it, or
        # came back to the signed VERP address (which only postrelay can make).
        about_row = match is not None and (sent_to or match["matched_by"] == "verp")
        if match is not None and not about_row:
            # Kept unmatched: the report names this row, but not a recipient it had.
            detail["claimed_log_id"] = str(match["id"])
            match = None
        if feedback.kind == "unsubscribe" and (match is not None or feedback.vouched) \
                and not _category(feedback, match):
            detail["no_category"] = "transactional mail: an unsubscribe does not stop it"
        return cls(feedback, match, recipient, tenant_id, sent_to, about_row, detail)

    def insert_params(self) -> dict[str, Any]:
        f, match = self.feedback, self.match
        # UUIDs as they are: encode_rows writes them as their text.
        return {"tenant_id": self.tenant_id, "email_log_id": match["id"] if match else None,
                "matched_by": self.matched_by(),
                "recipient": self.recipient, "kind": f.kind, "status": f.status,
                "diagnostic": f.diagnostic, "source": f.source,
                "source_event_id": f.source_event_id, "dedupe_key": self.dedupe_key,
                "detail": self.detail, "occurred_at": f.occurred_at, "sent_to": self.sent_to,
                "unless_suppressed_in": self.link_category()}

    def matched_by(self) -> str | None:
        """How the report found its message, or `token` when a signed unsubscribe link of
        a tenant still there named the recipient (no message needed); None: unmatched."""
        if self.match is not None:
            return str(self.match["matched_by"])
        return "token" if self.feedback.vouched and self.tenant_id is not None else None

    def link_category(self) -> str | None:
        """The category of an unsubscribe through a signed link, which every mail of the
        category repeats: it is left out while the address is suppressed there."""
        f = self.feedback
        return (f.category or "") if f.vouched and f.kind == "unsubscribe" else None

    def take_insert(self, inserted: dict[str, dict[str, Any]]) -> bool:
        """Whether this report's row was inserted (else it was recorded before, or it is an
        unsubscribe from a category the address is suppressed in already)."""
        row = inserted.get(self.dedupe_key)
        if row is None:
            return False
        self.feedback_id, self.soft_before = row["id"], row["soft_before"]
        return True

    def counts_soft(self) -> bool:
        """Whether this report counts toward its address's soft-bounce limit."""
        f = self.feedback
        return counts_as_soft(f.kind, f.status) and self.sent_to and self.tenant_id is not None

    def decide(self, policy: SuppressionPolicy,
               soft_seen: dict[tuple[Any, str | None], int]) -> None:
        """Whether this report suppresses; soft bounces count the batch's earlier ones
        (matched to a message sent to the recipient), which the insert could not see."""
        f = self.feedback
        key = (self.tenant_id, self.recipient)
        soft_before = self.soft_before + soft_seen.get(key, 0)
        soft = counts_as_soft(f.kind, f.status)
        if self.counts_soft():
            soft_seen[key] = soft_seen.get(key, 0) + 1
        self.category = _category(f, self.match) if f.kind == "unsubscribe" else ""
        # The words of a bounce by mail are read (a code that names no cause); a provider's
        # webhook gives its own verdict on the address, and its other classes stand.
        words = f.diagnostic if f.source == "mail" else None
        # An unsubscribe stops its category only: one about transactional mail (no
        # category) stops nothing, where '' would stop every category.
        rule = (suppresses(f.kind, f.status, words)
                and (f.kind != "unsubscribe" or self.category != "")) \
            or (soft and soft_before + 1 >= policy.soft_limit)
        trusted = self.sent_to or f.vouched
        self.suppress = bool(trusted and self.tenant_id is not None and rule)

    def apply_params(self) -> dict[str, Any]:
        f = self.feedback
        return {"email_log_id": self.match["id"] if self.match else None,
                "feedback_id": self.feedback_id, "delivery": DELIVERY.get(f.kind),
                "tenant_id": self.tenant_id, "recipient": self.recipient,
                "category": self.category, "reason": _reason(f), "source": f.source,
                "status": f.status, "suppress": self.suppress}

    def take_effect(self, applied: dict[str, Any]) -> relay.EventSpec | None:
        """Records what the apply did; the outbox event to emit, if any."""
        f, match = self.feedback, self.match
        assert self.feedback_id is not None
        event_type, spec = None, None
        # A matched or vouched one, whose tenant is there (None: unmatched, or deleted).
        if (self.about_row or f.vouched) and self.tenant_id is not None:
            event_type = EVENTS.get(f.kind)
            if event_type is not None:
                spec = relay.EventSpec(
                    event_type, _payload(f, self.feedback_id, match, self.recipient,
                                         applied["suppressed"], self.category),
                    tenant_id=self.tenant_id, aggregate_type="email",
                    aggregate_id=str(match["id"]) if match else str(self.recipient))
        self.done = Recorded(
            feedback_id=self.feedback_id, duplicate=False,
            email_log_id=match["id"] if match else None, tenant_id=self.tenant_id,
            matched_by=self.matched_by(), suppressed=applied["suppressed"],
            resolved_unknown=applied["old_status"] == "unknown",
            completed_job=applied["completed_job"], event_type=event_type)
        log_event(f"postrelay.feedback.{f.kind}",
                  logging.INFO if self.done.matched_by else logging.WARNING,
                  feedback_id=str(self.feedback_id), source=f.source,
                  matched_by=self.done.matched_by, recipient=self.recipient, status=f.status,
                  suppressed=self.done.suppressed,
                  completed_job=str(self.done.completed_job) if self.done.completed_job
                  else None)
        return spec

    def result(self) -> Recorded:
        if self.done is not None:
            return self.done
        f, match = self.feedback, self.match
        log_event("postrelay.feedback.duplicate", logging.DEBUG, kind=f.kind,
                  source=f.source, source_event_id=f.source_event_id)
        return Recorded(feedback_id=None, duplicate=True,
                        email_log_id=match["id"] if match else None, tenant_id=self.tenant_id,
                        matched_by=self.matched_by())


def _emit(conn: Connection, events: Events) -> None:
    """The batch's outbox events: one COPY per run of one source, one INSERT for a single
    event (cheaper than a COPY)."""
    if len(events) == 1:
        created_by, e = events[0]
        relay.emit(conn, e.event_type, e.payload, tenant_id=e.tenant_id,
                   aggregate_type=e.aggregate_type, aggregate_id=e.aggregate_id,
                   created_by=created_by)
        return
    for created_by, run in _runs(events):
        relay.emit_many(conn, run, created_by=created_by)


def _runs(events: Events) -> list[tuple[str, list[relay.EventSpec]]]:
    """The events in runs of one `created_by`, in order."""
    runs: list[tuple[str, list[relay.EventSpec]]] = []
    for created_by, spec in events:
        if runs and runs[-1][0] == created_by:
            runs[-1][1].append(spec)
        else:
            runs.append((created_by, [spec]))
    return runs


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


def _category(feedback: Feedback, match: dict[str, Any] | None) -> str:
    """An unsubscribe's category: the report's, else its message's ('': none, the message
    was transactional)."""
    return feedback.category or (match or {}).get("category") or ""


def _domain(address: str) -> str | None:
    local, at, domain = address.rpartition("@")
    return domain.lower() if local and at else None


def _reason(feedback: Feedback) -> str:
    words = [feedback.kind, feedback.status or "", f"({feedback.source})"]
    if feedback.diagnostic:
        words.append(feedback.diagnostic[:500])
    return " ".join(w for w in words if w)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
