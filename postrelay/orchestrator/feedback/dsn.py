"""Delivery status notifications (RFC 3464) read into `Feedback`: each recipient block's
Action, Status and Diagnostic-Code, from a message/delivery-status part (dsn_reports) or
from fields written into a notice's text (dsn_in_text).
"""

from __future__ import annotations

import re
from email.message import Message

from postrelay.orchestrator.feedback.keys import Keys, first_message_id
from postrelay.orchestrator.feedback.model import Feedback, bounce_kind, status_code
from postrelay.orchestrator.feedback.notice import (
    body_text,
    first_text_part,
    line_naming,
    notice_text,
    quoted_message_id,
)
from postrelay.orchestrator.feedback.parts import (
    blocks_of,
    clean,
    one_line,
    original_of,
    part_of,
    status_blocks,
    typed_address,
)

ACTIONS = {"delivered": "delivered", "relayed": "delivered", "expanded": "delivered",
           "delayed": "delayed"}
GAVE_UP = "4.4.7"  # delivery time expired (RFC 3463)
NULLMAILER_NOTICE = "This is the nullmailer delivery system."
RECIPIENT_FIELDS = ("final-recipient", "original-recipient")
DSN_FIELDS_IN_TEXT = re.compile(r"^(?:Reporting-MTA|Final-Recipient):", re.I | re.M)


def dsn_reports(msg: Message, source: str, event_id: str, keys: Keys) -> list[Feedback]:
    """The reports of `msg`'s delivery-status part, one per recipient block it acts on."""
    status_part = part_of(msg, ("message/delivery-status", "message/global-delivery-status"))
    return [] if status_part is None else \
        _dsn_blocks(msg, status_blocks(status_part), source, event_id, keys)


def dsn_in_text(msg: Message, source: str, event_id: str, keys: Keys) -> list[Feedback]:
    """A DSN's fields written into the notice's text (Amazon WorkMail's "Technical
    report:", a report whose parts are one text), from its first Reporting-MTA or
    Final-Recipient line on; the Message-ID of an original quoted in the text."""
    notice = notice_text(msg)
    start = DSN_FIELDS_IN_TEXT.search(notice)
    if start is None:
        return []
    keys.message_id = keys.message_id or quoted_message_id(body_text(msg))
    return _dsn_blocks(msg, blocks_of(notice[start.start():]), source, event_id, keys)


def _dsn_blocks(msg: Message, blocks: list[Message], source: str, event_id: str,
                keys: Keys) -> list[Feedback]:
    if not blocks:
        return []
    per_message, per_recipient = blocks[0], blocks[1:]
    if not per_recipient and per_message.get("final-recipient"):
        # AOL writes the message's and every recipient's fields as one block.
        per_recipient = _recipient_runs(per_message)
    keys.take_original(original_of(msg))
    keys.queue_id = keys.queue_id or clean(per_message.get("x-postfix-queue-id"))
    keys.message_id = keys.message_id or first_message_id(per_message.get("x-original-message-id"))
    reports = []
    notice = None  # the human-readable part, read only for a block without a diagnostic
    for block in per_recipient:
        original = typed_address(block.get("original-recipient"))
        recipient = typed_address(block.get("final-recipient")) or original
        if recipient and not _is_address(recipient):
            # Exim's local delivery names the pipe or file it failed to write to
            # (`Final-Recipient: rfc822;|/usr/bin/procmail`), an X.400 gateway an X.400
            # address: the address it was for is the Original-Recipient, else the only one
            # X-Failed-Recipients names.
            recipient = original or _only_failed(msg) or recipient
        action = _action(block.get("action"))
        diagnostic = one_line(block.get("diagnostic-code"))
        if diagnostic is None and recipient:
            # OpenSMTPD writes only the class (`Status: 5.0.0`) and puts the remote's
            # reply on the notice's line for the recipient: `ann@…: 550 5.1.1 …`.
            notice = body_text(first_text_part(msg)) if notice is None else notice
            diagnostic = one_line(line_naming(notice, recipient))
        status = status_code(block.get("status"), diagnostic)
        if action == "expired":  # not RFC 3464's, SendGrid's: it gave up, often without a code
            status = status or GAVE_UP
        expired = action == "delayed" and _expired(block, status, diagnostic, msg)
        if action in ("failed", "expired") or expired:
            kind = bounce_kind(status, diagnostic)
        elif action in ACTIONS:
            kind = ACTIONS[action]
        else:
            continue
        reports.append(keys.feedback(kind, source, event_id, recipient=recipient,
                                     original_recipient=original if original != recipient
                                     else None,
                                     status=status, diagnostic=diagnostic, detail={
                                         "format": "dsn", "action": action,
                                         "remote_mta": one_line(block.get("remote-mta")),
                                         "reporting_mta": one_line(
                                             per_message.get("reporting-mta"))}))
    return reports


def _recipient_runs(block: Message) -> list[Message]:
    """A block that holds several recipients' fields, one block per recipient: each starts
    at a Final-Recipient or Original-Recipient field the one before already has."""
    runs: list[Message] = []
    for name, value in block.items():
        if not runs or (name.lower() in RECIPIENT_FIELDS and name in runs[-1]):
            runs.append(Message())
        runs[-1][name] = value
    return [run for run in runs if any(field in run for field in RECIPIENT_FIELDS)]


def _is_address(value: str) -> bool:
    local, at, domain = value.partition("@")
    return bool(local and at and domain) and not value.startswith(("|", "/"))


def _only_failed(msg: Message) -> str | None:
    """The one address of Exim's X-Failed-Recipients, if it names one."""
    named = [a.strip().lower() for v in msg.get_all("x-failed-recipients", [])
             for a in str(v).split(",") if a.strip()]
    return named[0] if len(named) == 1 else None


def _expired(block: Message, status: str | None, diagnostic: str | None,
             msg: Message) -> bool:
    """Whether a `delayed` block reports a message the MTA gave up on: OpenSMTPD 6.8 reports
    an expired envelope as `delayed`, 4.4.7, "Envelope expired", and nullmailer reports
    only what it gave up on. Microsoft's and Oracle's delay warnings give 4.4.7 too, with a
    Will-Retry-Until or words of their own: the MTA is still trying."""
    gave_up = status is not None and status.endswith(".4.7") and \
        block.get("will-retry-until") is None and "expired" in (diagnostic or "").lower()
    return gave_up or _from_nullmailer(msg)


def _from_nullmailer(msg: Message) -> bool:
    """nullmailer writes a report only for a message it gave up on: `delayed`, with the
    last reply's code, when its failures were temporary until the message expired."""
    return NULLMAILER_NOTICE in body_text(first_text_part(msg))


def _action(value: str | None) -> str:
    """The Action field's value without what follows it: sendmail writes `relayed (to
    non-DSN-aware mailer)`, an RFC 822 comment the field may carry (RFC 3464 2.1.1)."""
    words = (value or "").split("(", 1)[0].split()
    return words[0].lower() if words else ""
