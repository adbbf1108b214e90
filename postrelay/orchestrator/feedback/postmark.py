"""Postmark's webhooks (Bounce, SpamComplaint, Delivery, SubscriptionChange), read into
`Feedback`. Postmark authenticates with HTTP basic auth in the webhook's URL, checked by
`PostmarkAuth`.

    PostmarkAuth("postmark", "a long password").check(request.headers.get("authorization"))
    reports, ignored = postmark_reports(json.loads(body))   # one record per request
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from postrelay.core.errors import ValidationError
from postrelay.orchestrator.feedback.model import Feedback, address_verdict, bounce_kind
from postrelay.orchestrator.feedback.webhook import (
    WebhookAuthError,
    field,
    iso_time,
    obj,
    short,
    status_of,
)

# Bounce types (Postmark's "Type") and the kind each is. A type without its own code
# speaks of the address (HardBounce: "unknown user, mailbox not found") or of policy
# (Blocked, DMARCPolicy, and SpamNotification, a receiving server's refusal of the message as
# spam, which Postmark does not deactivate the address for: given 5.7.x so that they never
# suppress); the rest are kept `unparsed` for an operator.
BOUNCE_TYPES = {
    "HardBounce": ("bounced", None), "BadEmailAddress": ("bounced", None),
    "SoftBounce": ("soft-bounced", None), "Transient": ("delayed", None),
    "DnsError": ("soft-bounced", None), "AutoResponder": ("auto-reply", None),
    "SpamComplaint": ("complaint", None), "Unsubscribe": ("unsubscribe", None),
    "Blocked": ("bounced", "5.7.1"), "DMARCPolicy": ("bounced", "5.7.1"),
    "SpamNotification": ("bounced", "5.7.1"),
}
# SubscriptionChange with SuppressSending: why Postmark stopped sending to the address. One
# for a hard bounce or a spam complaint follows the Bounce or SpamComplaint record of it,
# which says more: it is answered and not kept, so that one bounce is one report and one
# event. A manual suppression (an unsubscribe) has no other record.
RECORDED_ELSEWHERE = frozenset({"HardBounce", "SpamComplaint"})
SUPPRESSION_REASONS = {"ManualSuppression": "unsubscribe"}


class PostmarkAuth:
    def __init__(self, username: str, password: str) -> None:
        self._expected = hashlib.sha256(f"{username}:{password}".encode()).digest()

    def check(self, authorization: str | None) -> None:
        """WebhookAuthError unless `authorization` is Basic with the configured pair
        (compared as digests, in constant time)."""
        scheme, _, encoded = (authorization or "").partition(" ")
        if scheme.lower() != "basic":
            raise WebhookAuthError("HTTP basic authentication is required")
        try:
            given = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise WebhookAuthError("the basic credentials are not base64") from None
        if not hmac.compare_digest(hashlib.sha256(given).digest(), self._expected):
            raise WebhookAuthError("wrong user name or password")


def postmark_reports(payload: Any) -> tuple[list[Feedback], int]:
    """The feedback in one webhook request, and 1 when the record is answered and not kept.
    ValidationError naming the field when the record is malformed or of a type postrelay
    does not take."""
    record = obj(payload, "body")
    record_type = field(record, "RecordType", str, "")
    if record_type in ("Bounce", "SpamComplaint"):
        return [_bounce(record)], 0
    if record_type == "Delivery":
        return [_delivery(record)], 0
    if record_type == "SubscriptionChange":
        found = _subscription(record)
        return ([], 1) if found is None else ([found], 0)
    raise ValidationError("RecordType", "must be Bounce, SpamComplaint, Delivery or "
                                        "SubscriptionChange")


def _bounce(record: Mapping[str, Any]) -> Feedback:
    bounce_type = field(record, "Type", str, "")
    bounce_id = field(record, "ID", (int, str), "")
    details = field(record, "Details", str, "", required=False)
    description = field(record, "Description", str, "", required=False)
    kind, policy = BOUNCE_TYPES.get(bounce_type, ("unparsed", None))
    given = status_of(details)
    status: str | None
    if policy is not None:
        # Postmark's verdict on the message whatever code its Details quote (a 421 4.7.0
        # deferral counted as a soft bounce, a 5.1.1 suppressed); the code stays there.
        status = policy
    elif kind == "bounced":  # HardBounce, BadEmailAddress
        status = address_verdict(given)
        kind = bounce_kind(status)
    else:
        status = given
    return Feedback(
        kind=kind, source="postmark", recipient=field(record, "Email", str, ""),
        status=status if kind in ("bounced", "soft-bounced", "delayed") else None,
        diagnostic=short(details or description), source_event_id=f"bounce:{bounce_id}",
        # A record without one names no message: kept unmatched, as a 400 would have
        # Postmark retry it until it gave up.
        queue_id=_message_id(record, required=False),
        occurred_at=iso_time(field(record, "BouncedAt", str, "", required=False), "BouncedAt"),
        detail=_detail(record, type=bounce_type, type_code=record.get("TypeCode"),
                       description=short(description), inactive=record.get("Inactive")))


def _delivery(record: Mapping[str, Any]) -> Feedback:
    message_id = _message_id(record)
    recipient = field(record, "Recipient", str, "")
    delivered_at = field(record, "DeliveredAt", str, "", required=False)
    return Feedback(
        kind="delivered", source="postmark", recipient=recipient,
        diagnostic=short(record.get("Details")),
        # Postmark gives a delivery no id of its own: the message and recipient are one.
        source_event_id=f"delivery:{message_id}:{recipient.lower()}", queue_id=message_id,
        occurred_at=iso_time(delivered_at, "DeliveredAt"), detail=_detail(record))


def _subscription(record: Mapping[str, Any]) -> Feedback | None:
    # None for a suppression an operator or the customer made by hand, and a reactivation:
    # then the report names no message, and is kept unmatched.
    message_id = _message_id(record, required=False)
    recipient = field(record, "Recipient", str, "")
    changed_at = field(record, "ChangedAt", str, "")
    suppress = field(record, "SuppressSending", bool, "")
    reason = field(record, "SuppressionReason", str, "", required=False)
    if suppress and reason in RECORDED_ELSEWHERE:
        return None
    # A reactivation, or a reason postrelay does not act on: kept for an operator.
    kind = SUPPRESSION_REASONS.get(reason or "", "unparsed") if suppress else "unparsed"
    return Feedback(
        kind=kind, source="postmark", recipient=recipient, diagnostic=short(reason),
        source_event_id=f"subscription:{message_id or ''}:{recipient.lower()}:{changed_at}:"
                        f"{suppress}",
        queue_id=message_id, occurred_at=iso_time(changed_at, "ChangedAt"),
        detail=_detail(record, suppress_sending=suppress, suppression_reason=reason,
                       origin=short(record.get("Origin"))))


def _message_id(record: Mapping[str, Any], *, required: bool = True) -> str | None:
    """Postmark's MessageID: the id its SMTP service answers in the 250 reply, which
    postrelay keeps as the log row's queue id."""
    value = field(record, "MessageID", str, "", required=required)
    return None if value is None else str(value)


def _detail(record: Mapping[str, Any], **more: Any) -> dict[str, Any]:
    found = {"record_type": record.get("RecordType"), "tag": short(record.get("Tag")),
             "message_stream": short(record.get("MessageStream")),
             "server_id": record.get("ServerID"), **more}
    return {k: v for k, v in found.items() if v is not None}
