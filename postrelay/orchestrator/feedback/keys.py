"""What ties a report to the message it is about: the VERP token of the address it came
back to (or of the original's Return-Path), the original's Message-ID, the relay's queue
id. parse.py's readers fill a `Keys` as they read, and make each report with it.

    keys = Keys(msg, envelope_to, return_path)
    keys.take_original(returned_message)
    keys.feedback("bounced", "mail", event_id, recipient="ann@example.com", status="5.1.1")
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from email.message import Message
from email.utils import getaddresses, parseaddr
from typing import Any
from uuid import UUID

from postrelay.orchestrator.feedback.model import Feedback
from postrelay.orchestrator.feedback.verp import ReturnPath, TokenError

MESSAGE_ID = re.compile(r"<[^<>\s@]+@[^<>\s@]+>")
# Where a receiving MTA or a fetcher writes the envelope recipient.
ENVELOPE_HEADERS = ("delivered-to", "x-original-to", "envelope-to", "x-envelope-to", "to")


class Keys:
    """What ties a report to its message: the VERP token of the address it came back to
    (or of the original's Return-Path), the original's Message-ID, the relay's queue id."""

    def __init__(self, msg: Message | None, envelope_to: Sequence[str],
                 return_path: ReturnPath | None) -> None:
        self.return_path = return_path
        self.log_id: UUID | None = None
        self.refused: str | None = None
        self.message_id: str | None = None
        self.queue_id: str | None = None
        for address in envelope_to:
            self.take_verp(address)
        if self.log_id is not None or return_path is None:
            return  # named by the envelope (or no bounce domain): the headers add nothing
        headers = [v for h in ENVELOPE_HEADERS for v in (msg.get_all(h, []) if msg else [])]
        for _, address in getaddresses(headers):
            self.take_verp(address)

    def take_verp(self, address: str) -> None:
        if self.return_path is None or self.log_id is not None or not address:
            return
        if not self.return_path.is_ours(address) or \
                not address.lower().startswith("bounce-"):
            return
        try:
            self.log_id = self.return_path.log_id(address)
        except TokenError as exc:
            self.refused = exc.rule

    def take_original(self, original: Message | None) -> None:
        if original is None:
            return
        self.message_id = self.message_id or first_message_id(original.get("message-id"))
        if self.log_id is None:
            self.take_verp(parseaddr(original.get("return-path") or "")[1])

    def feedback(self, kind: str, source: str, event_id: str, *, recipient: str | None,
                 original_recipient: str | None = None, status: str | None = None,
                 diagnostic: str | None = None,
                 detail: dict[str, Any] | None = None) -> Feedback:
        detail = {k: v for k, v in (detail or {}).items() if v is not None}
        if self.refused:
            detail["verp_refused"] = self.refused
        return Feedback(kind=kind, source=source, recipient=recipient or None,
                        original_recipient=original_recipient, status=status,
                        diagnostic=diagnostic, source_event_id=event_id, log_id=self.log_id,
                        message_id=self.message_id, queue_id=self.queue_id, detail=detail)


def first_message_id(value: str | None) -> str | None:
    match = MESSAGE_ID.search(value or "")
    return match.group(0) if match else None
