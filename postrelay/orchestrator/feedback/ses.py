"""Amazon SES notifications (Bounce, Complaint, Delivery; the event-publishing format's
DeliveryDelay too), as SNS delivers them, read into `Feedback`.

    ses_reports(json.loads(sns_message["Message"]), sns_message["MessageId"])

Matched by the Message-ID header SES copies from the original (`mail.headers`,
`mail.commonHeaders`) and by SES's message id, which its SMTP interface answers in the 250
reply (the log row's queue id).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from postrelay.core.errors import ValidationError
from postrelay.orchestrator.feedback.keys import MESSAGE_ID
from postrelay.orchestrator.feedback.model import (
    Feedback,
    address_verdict,
    bounce_kind,
    status_code,
)
from postrelay.orchestrator.feedback.parse import ARF_COMPLAINTS
from postrelay.orchestrator.feedback.webhook import field, iso_time, obj, short

# Bounce subtypes about this message, not the address, whichever type SES gives them (its
# guide lists them as Transient): a bounce of the message, given the code it stands for, that
# neither suppresses nor counts as a soft bounce. Any other permanent bounce without a
# specific code (none, or only the class: 5.0.0) is SES's verdict on the address (General,
# NoEmail, Suppressed): a hard bounce.
MESSAGE_SUBTYPES = {"MessageTooLarge": "5.3.4", "ContentRejected": "5.6.0",
                    "AttachmentRejected": "5.6.0"}
IGNORED_TYPES = frozenset({"Send", "Reject", "Open", "Click", "Rendering Failure",
                           "Subscription", "AmazonSnsSubscriptionSucceeded"})


def ses_reports(notification: Any, sns_message_id: str) -> tuple[list[Feedback], int]:
    """The feedback in one SES notification, and 1 when it is of a type that is not
    feedback (Send, Open, ...) and so ignored."""
    note = obj(notification, "Message")
    kind = note.get("notificationType", note.get("eventType"))
    if not isinstance(kind, str):
        raise ValidationError("Message.notificationType", "required (or eventType)")
    if kind in IGNORED_TYPES:
        return [], 1
    mail = obj(note.get("mail"), "Message.mail")
    keys = _keys(mail)
    if kind == "Bounce":
        return _bounce(obj(note.get("bounce"), "Message.bounce"), keys), 0
    if kind == "Complaint":
        return _complaint(obj(note.get("complaint"), "Message.complaint"), keys), 0
    if kind == "Delivery":
        return _delivery(obj(note.get("delivery"), "Message.delivery"), keys,
                         sns_message_id), 0
    if kind == "DeliveryDelay":
        return _delay(obj(note.get("deliveryDelay"), "Message.deliveryDelay"), keys,
                      sns_message_id), 0
    raise ValidationError("Message.notificationType",
                          "must be Bounce, Complaint, Delivery or DeliveryDelay")


def _bounce(bounce: Mapping[str, Any], keys: dict[str, Any]) -> list[Feedback]:
    where = "Message.bounce."
    bounce_type = field(bounce, "bounceType", str, where)
    subtype = field(bounce, "bounceSubType", str, where, required=False)
    feedback_id = field(bounce, "feedbackId", str, where)
    at = iso_time(field(bounce, "timestamp", str, where, required=False), f"{where}timestamp")
    reports = []
    for i, rcpt in enumerate(_list(bounce, "bouncedRecipients", where)):
        rwhere = f"{where}bouncedRecipients[{i}]."
        rcpt = obj(rcpt, rwhere.rstrip("."))
        diagnostic = field(rcpt, "diagnosticCode", str, rwhere, required=False)
        given = field(rcpt, "status", str, rwhere, required=False)
        status = status_code(given, diagnostic)
        if subtype in MESSAGE_SUBTYPES:  # the code given stays in `detail`
            kind, status = "bounced", MESSAGE_SUBTYPES[subtype]
        elif bounce_type == "Permanent":
            status = address_verdict(status)
            kind = bounce_kind(status)
        else:  # Transient (mailbox full, still trying elsewhere) or Undetermined
            kind = "soft-bounced"
        reports.append(Feedback(
            kind=kind, source="ses", recipient=field(rcpt, "emailAddress", str, rwhere),
            status=status, diagnostic=short(diagnostic), source_event_id=feedback_id,
            occurred_at=at, **keys,
            detail=_detail(bounce_type=bounce_type, bounce_sub_type=subtype,
                           status=short(given), action=rcpt.get("action"),
                           reporting_mta=short(bounce.get("reportingMTA")))))
    return reports


def _complaint(complaint: Mapping[str, Any], keys: dict[str, Any]) -> list[Feedback]:
    where = "Message.complaint."
    feedback_id = field(complaint, "feedbackId", str, where)
    at = iso_time(field(complaint, "timestamp", str, where, required=False),
                  f"{where}timestamp")
    recipients = _list(complaint, "complainedRecipients", where)
    feedback_type = field(complaint, "complaintFeedbackType", str, where, required=False)
    sub_type = field(complaint, "complaintSubType", str, where, required=False)
    # As for an ARF report by mail: `not-spam` and `auth-failure` are no complaint about
    # the mail, and are kept for an operator. Many reports give no type at all.
    kind = "complaint" if feedback_type is None or feedback_type.lower() in ARF_COMPLAINTS \
        else "unparsed"
    if sub_type == "OnAccountSuppressionList":
        # Not sent: SES keeps the address on its account's list (for a complaint before).
        # As its bounce of that subtype, a verdict on the address; no new complaint.
        kind = "bounced"
    detail = _detail(feedback_type=short(feedback_type),
                     user_agent=short(complaint.get("userAgent")), sub_type=short(sub_type))
    return [Feedback(kind=kind, source="ses",
                     recipient=field(obj(r, f"{where}complainedRecipients[{i}]"),
                                     "emailAddress", str,
                                     f"{where}complainedRecipients[{i}]."),
                     source_event_id=feedback_id, occurred_at=at, detail=detail, **keys)
            for i, r in enumerate(recipients)]


def _delivery(delivery: Mapping[str, Any], keys: dict[str, Any],
              event_id: str) -> list[Feedback]:
    where = "Message.delivery."
    at = iso_time(field(delivery, "timestamp", str, where, required=False), f"{where}timestamp")
    response = field(delivery, "smtpResponse", str, where, required=False)
    return [Feedback(kind="delivered", source="ses",
                     recipient=_text(r, f"{where}recipients[{i}]"),
                     diagnostic=short(response), source_event_id=event_id, occurred_at=at,
                     detail=_detail(reporting_mta=short(delivery.get("reportingMTA"))),
                     **keys)
            for i, r in enumerate(_list(delivery, "recipients", where))]


def _delay(delay: Mapping[str, Any], keys: dict[str, Any], event_id: str) -> list[Feedback]:
    where = "Message.deliveryDelay."
    at = iso_time(field(delay, "timestamp", str, where, required=False), f"{where}timestamp")
    reports = []
    for i, rcpt in enumerate(_list(delay, "delayedRecipients", where)):
        rwhere = f"{where}delayedRecipients[{i}]."
        rcpt = obj(rcpt, rwhere.rstrip("."))
        diagnostic = field(rcpt, "diagnosticCode", str, rwhere, required=False)
        reports.append(Feedback(
            kind="delayed", source="ses", recipient=field(rcpt, "emailAddress", str, rwhere),
            status=status_code(field(rcpt, "status", str, rwhere, required=False), diagnostic),
            diagnostic=short(diagnostic), source_event_id=event_id, occurred_at=at,
            detail=_detail(delay_type=short(delay.get("delayType"))), **keys))
    return reports


def _keys(mail: Mapping[str, Any]) -> dict[str, Any]:
    """The match keys: SES's message id (the 250 reply's) and the original Message-ID."""
    where = "Message.mail."
    ses_id = field(mail, "messageId", str, where)
    message_id = None
    headers = mail.get("headers")
    if isinstance(headers, list):
        for header in headers:
            if isinstance(header, Mapping) and str(header.get("name", "")).lower() \
                    == "message-id" and isinstance(header.get("value"), str):
                message_id = header["value"]
                break
    common = mail.get("commonHeaders")
    if message_id is None and isinstance(common, Mapping) \
            and isinstance(common.get("messageId"), str):
        message_id = common["messageId"]
    if message_id is not None and not MESSAGE_ID.search(f"<{message_id.strip('<> ')}>"):
        message_id = None  # SES's own id in commonHeaders, not a header postrelay wrote
    return {"queue_id": ses_id, "message_id": message_id}


def _list(parent: Mapping[str, Any], name: str, where: str) -> list[Any]:
    value = field(parent, name, list, where)
    if not value:
        raise ValidationError(f"{where}{name}", "must name at least one recipient")
    return value  # type: ignore[no-any-return]


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(where, "must be a string")
    return value


def _detail(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}
