"""Mail to the bounce domain, read into `Feedback`: DSNs (RFC 3464, dsn.py), complaints
(RFC 5965 ARF), the non-standard bounces real MTAs still send (GNU Mailman's flufl.bounce
detectors, then detectors.py for formats they do not know), auto-replies (RFC 3834). What none of
them understands is `unparsed`, kept for an operator.

    reports = parse_mail(raw_bytes, envelope_to=["bounce-…@bounces.acme.example"],
                         return_path=path)

Never raises on bad input: a truncated or malformed message is an `unparsed` report that
says why.
"""

from __future__ import annotations

import email
import hashlib
from collections.abc import Sequence
from email.message import Message
from email.utils import collapse_rfc2231_value, parseaddr

from postrelay.orchestrator.feedback.cut import HEAD_BYTES, Cut
from postrelay.orchestrator.feedback.detectors import flufl_failures, other_failures
from postrelay.orchestrator.feedback.dsn import dsn_in_text, dsn_reports
from postrelay.orchestrator.feedback.keys import Keys
from postrelay.orchestrator.feedback.model import (
    Feedback,
    bounce_kind,
    notice_code,
    reply_class,
)
from postrelay.orchestrator.feedback.notice import (
    body_text,
    near,
    notice_text,
    paragraph,
    quoted_message_id,
)
from postrelay.orchestrator.feedback.outline import READ_POLICY, outline
from postrelay.orchestrator.feedback.parts import (
    clean,
    headers_of,
    one_line,
    original_of,
    part_of,
    status_blocks,
    typed_address,
)
from postrelay.orchestrator.feedback.verp import ReturnPath

ARF_COMPLAINTS = frozenset({"abuse", "fraud", "virus", "other"})
# ARF's draft types for a recipient's request to leave a sender's or a list's mail (mailbox
# providers' unsubscribe buttons; their Removal-Recipient names the address): an unsubscribe
# from the reported message's category, not a complaint that stops all mail.
ARF_UNSUBSCRIBES = frozenset({"opt-out", "opt-out-list"})
JMRP_RECIPIENT = "x-hmxmroriginalrecipient"
VACATION_HEADERS = ("x-autoreply", "x-autorespond", "x-autoresponder")
# Where bounces come from (RFC 5321 4.5.1, and custom): their Auto-Submitted does not make
# them auto-replies, and one that no reader understands is kept for an operator.
MAIL_SYSTEM = ("mailer-daemon", "postmaster")


def parse_mail(raw: bytes, *, envelope_to: Sequence[str] = (),
               return_path: ReturnPath | None = None, source: str = "mail",
               max_bytes: int | None = None, cut: Cut | None = None) -> list[Feedback]:
    """Every report `raw` holds (one per recipient of a DSN), at least one. With `cut`,
    `raw` is only the head of a message past `max_bytes` (cut.py)."""
    size = len(raw) if cut is None else cut.size
    if max_bytes is not None and size > max_bytes:
        head = raw[:HEAD_BYTES].split(b"\r\n\r\n", 1)[0].split(b"\n\n", 1)[0]
        return [_unparsed(_message(head), source, _digest(raw) if cut is None else cut.digest,
                          envelope_to, return_path,
                          f"{size} bytes, over the {max_bytes}-byte limit; headers kept")]
    event_id = None
    try:
        # A report's outline when it has one: the parts classification reads, unparsed the
        # rest (a DSN often returns the whole original message).
        msg = outline(raw) or _message(raw)
        event_id = mail_event_id(msg, raw)
        reports = _reports(msg, source, event_id, envelope_to, return_path)
    except Exception as exc:  # a parser bug or a message email cannot read: kept, not lost
        return [_unparsed(None, source, event_id or _digest(raw), envelope_to, return_path,
                          f"unreadable: {type(exc).__name__}: {exc}")]
    return reports


def mail_event_id(msg: Message, raw: bytes) -> str:
    """The id of a received message's reports: its Message-ID, else a hash of its bytes.
    The same message delivered twice has the same id; another message, another one."""
    return clean(msg.get("message-id")) or _digest(raw)


def _reports(msg: Message, source: str, event_id: str, envelope_to: Sequence[str],
             return_path: ReturnPath | None) -> list[Feedback]:
    keys = Keys(msg, envelope_to, return_path)
    # An RFC 2231 parameter comes back as a (charset, language, value) tuple: collapsed.
    report_type = collapse_rfc2231_value(msg.get_param("report-type") or "").lower() \
        if msg.get_content_type() == "multipart/report" else ""
    if report_type == "delivery-status":
        # A status part that does not read as blocks of fields (Mimecast's `Action :`) may
        # still be a bounce a detector knows; a report whose boundary is not the one it
        # declares is one text, its fields in it.
        return dsn_reports(msg, source, event_id, keys) or \
            dsn_in_text(msg, source, event_id, keys) or \
            _non_standard(msg, source, event_id, keys) or [
                _unparsed(msg, source, event_id, envelope_to, return_path,
                          "a delivery-status report without a recipient block", keys)]
    if report_type == "feedback-report":
        return _arf(msg, source, event_id, keys)
    if report_type:  # a read receipt (disposition-notification), or one of its own
        return [_unparsed(msg, source, event_id, envelope_to, return_path,
                          f"report-type {report_type} is not one postrelay reads", keys)]
    # Without a report-type (some MTAs leave it out), the parts below say what it is.
    if msg.is_multipart() and (complaint := _jmrp(msg, source, event_id, keys)) is not None:
        return [complaint]
    # OpenSMTPD sends its DSN as multipart/mixed: its delivery-status part still says
    # which recipients failed and which are only delayed, which no text heuristic knows.
    found = dsn_reports(msg, source, event_id, keys) if msg.is_multipart() else []
    if found:
        return found
    found = dsn_in_text(msg, source, event_id, keys) or \
        _non_standard(msg, source, event_id, keys)
    if found:
        return found
    if _auto_reply(msg):
        return [keys.feedback("auto-reply", source, event_id, recipient=_from(msg),
                              detail={"subject": one_line(msg.get("subject")),
                                      "auto_submitted": one_line(msg.get("auto-submitted"))})]
    return [_unparsed(msg, source, event_id, envelope_to, return_path,
                      "neither a DSN, an ARF report, a known bounce format nor an auto-reply",
                      keys)]


def _arf(msg: Message, source: str, event_id: str, keys: Keys) -> list[Feedback]:
    report = part_of(msg, ("message/feedback-report",))
    blocks = status_blocks(report) if report is not None else []
    fields = blocks[0] if blocks else Message()
    feedback_type = (fields.get("feedback-type") or "").strip().lower()
    original = original_of(msg)
    keys.take_original(original)
    if keys.log_id is None and fields.get("original-mail-from"):
        keys.take_verp(typed_address(fields.get("original-mail-from")) or "")
    # Original-Rcpt-To may come more than once (RFC 5965 3.2): a report for each.
    recipients = [typed_address(a) for a in fields.get_all("original-rcpt-to", [])] or \
        [typed_address(fields.get("removal-recipient"))]
    # Not the original's To: receivers redact it (Microsoft's JMRP) or it names a list. A
    # report without a recipient is matched to a message with one, which names it.
    kind = "complaint" if feedback_type in ARF_COMPLAINTS else \
        "unsubscribe" if feedback_type in ARF_UNSUBSCRIBES else "unparsed"
    detail = {"format": "arf", "feedback_type": feedback_type or None,
              "user_agent": one_line(fields.get("user-agent")),
              "source_ip": one_line(fields.get("source-ip")),
              "original_headers": headers_of(original)}
    return [keys.feedback(kind, source, event_id, recipient=recipient, detail=detail)
            for recipient in dict.fromkeys(recipients)]


def _jmrp(msg: Message, source: str, event_id: str, keys: Keys) -> Feedback | None:
    """A complaint of Microsoft's JMRP in its own format (the one it offers first): not an
    ARF report but the reported message attached whole, its recipient in the header
    Outlook.com adds to it."""
    original = original_of(msg)
    if original is None or JMRP_RECIPIENT not in original:
        return None
    keys.take_original(original)
    return keys.feedback("complaint", source, event_id,
                         recipient=_from_header(original.get(JMRP_RECIPIENT)),
                         detail={"format": "jmrp", "original_headers": headers_of(original)})


def _non_standard(msg: Message, source: str, event_id: str, keys: Keys) -> list[Feedback]:
    """A bounce in a format of its own: flufl.bounce's detectors, then the formats they do
    not know (detectors.py)."""
    temporary, permanent = flufl_failures(msg)
    # flufl's temporary failures are delay warnings ("will keep trying"): the MTA is still
    # trying, and a warning repeated daily must not count toward the soft-bounce limit.
    pending = "delayed"
    text = body_text(msg)
    if not temporary and not permanent:
        temporary, permanent = other_failures(text)
        pending = "soft-bounced"  # dma's: it gave up after temporary failures
    if not temporary and not permanent:
        return []
    keys.message_id = keys.message_id or quoted_message_id(text)
    # Codes are read from the notice alone: the returned message's headers hold dotted
    # numbers and versions (`Eudora Version 5.0.2`) that are no one's status.
    notice = notice_text(msg)
    # A detector may take addresses from an original quoted inline (Zoho's: its Message-ID,
    # its sender): when the notice names some of them, those are the ones that failed.
    lowered = notice.lower()
    named = {a for a in temporary | permanent if a.decode("ascii", "replace") in lowered}
    failed = [a.decode("ascii", "replace") for a in temporary | permanent]
    reports = []
    for addresses, temporary_kind in ((permanent, False), (temporary, True)):
        for raw in sorted(addresses):
            if named and raw not in named:
                continue
            address = raw.decode("ascii", "replace")
            own = near(notice, address)
            # The code in the recipient's own paragraph, the notice's first one otherwise;
            # else the class of the reply it quotes. A failure that says no more (Exim's
            # "retry timeout exceeded", a bare `550`) is 5.0.0: it counts toward the
            # soft-bounce limit, unless its words say the mailbox is gone (model.suppresses).
            status = notice_code(own) or notice_code(notice) or reply_class(own) or \
                reply_class(notice)
            if status is None or status[0] not in "45":
                status = None if temporary_kind else "5.0.0"
            # Whether the state is passing, from the recipient's paragraph alone: the next
            # one may be another recipient's full mailbox. The diagnostic is that paragraph
            # too, when it says more than the address (Lotus Notes gives the reason after a
            # blank line): not the next recipient's unknown user, nor the returned message.
            own_words = paragraph(notice, address, failed)
            kind = pending if temporary_kind else bounce_kind(status, own_words)
            words = own_words if own_words and len(own_words) > len(address) + 3 else \
                near(notice, address) or near(text, address)
            reports.append(keys.feedback(
                kind, source, event_id, recipient=address, status=status,
                diagnostic=one_line(words),
                detail={"format": "non-standard", "subject": one_line(msg.get("subject"))}))
    return reports


def _unparsed(msg: Message | None, source: str, event_id: str, envelope_to: Sequence[str],
              return_path: ReturnPath | None, reason: str,
              keys: Keys | None = None) -> Feedback:
    try:
        keys = keys or Keys(msg, envelope_to, return_path)
        detail = {"reason": reason, "headers": headers_of(msg)}
    except Exception:  # headers too broken to read: the reason alone
        keys, detail = Keys(None, envelope_to, return_path), {"reason": reason}
    return keys.feedback("unparsed", source, event_id, recipient=None, detail=detail)


def _digest(raw: bytes) -> str:
    """The id of a message without a Message-ID: the same for the same message, whichever
    line ends it came with (SMTP's CRLF, a file's LF) and whatever blank lines follow it
    (an mbox's separator). cut.StreamDigest reads it in pieces: the two must agree."""
    return hashlib.sha256(raw.replace(b"\r\n", b"\n").rstrip(b"\n")).hexdigest()


def _message(raw: bytes) -> Message:
    return email.message_from_bytes(raw, policy=READ_POLICY)


def _from_header(value: str | None) -> str | None:
    address = parseaddr(value or "")[1]
    return address.lower() or None


def _from(msg: Message) -> str | None:
    return _from_header(msg.get("from"))


def _auto_reply(msg: Message) -> bool:
    sender = _from(msg) or ""
    if sender.partition("@")[0] in MAIL_SYSTEM:
        return False
    submitted = (msg.get("auto-submitted") or "").strip().lower()
    if submitted and submitted != "no":
        return True
    if any(msg.get(h) for h in VACATION_HEADERS):
        return True
    precedence = (msg.get("precedence") or "").strip().lower()
    # iCloud's vacation reply carries no Auto-Submitted: its own X-Apple-Action says it.
    return precedence == "auto_reply" or \
        str(msg.get("x-apple-action") or "").strip().upper() == "VACATION" or \
        (msg.get("subject") or "").lower().startswith(
            ("out of office", "automatic reply", "auto reply", "auto:", "autoreply"))


