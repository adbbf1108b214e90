"""Feedback as values, and the pure rules about it: which kinds suppress, what each does to
the log row, which outbox event it emits, and when two reports are the same report."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from postrelay.core.errors import ValidationError
from postrelay.core.limits import storable
from postrelay.orchestrator.addresses import ADDRESS_MAX, stored_form
from postrelay.orchestrator.replies import UNSPECIFIC, refuses_mailbox, says_passing
from postrelay.orchestrator.schema import FEEDBACK_KINDS

if TYPE_CHECKING:
    from postrelay.core.settings import Settings

SOURCES = ("mail", "ses", "postmark", "sendgrid", "one-click")
_STATUS = re.compile(r"^[245]\.\d{1,3}\.\d{1,3}$")
# An enhanced status code (RFC 3463) as replies and notices write it: on its own or after a
# reply code (`550 5.1.1`, `550-5.1.1`), not inside a dotted number: the `[64.4.15.110]` of a
# returned Received line, a version (`SMSSMTP 4.1.5.31`, `mxl_mta-5.5.0-3`) read as codes
# made a dead address a soft bounce, or a bounce that suppressed nothing.
ENHANCED = re.compile(r"(?:(?<=\d{3}-)|(?<![\w.-]))([245])\.(\d{1,3})\.(\d{1,3})(?![\w-]|\.\d)")
# The fields a report quotes from what a mail server or provider sent.
QUOTED_FIELDS = ("recipient", "original_recipient", "diagnostic", "source_event_id",
                 "message_id", "queue_id", "category")

# What each kind makes of the log row's delivery outcome, and the event it emits.
DELIVERY = {"delivered": "delivered", "delayed": "delayed", "soft-bounced": "soft-bounced",
            "bounced": "bounced", "complaint": "complained"}
EVENTS = {"delivered": "email.delivered", "soft-bounced": "email.bounced",
          "bounced": "email.bounced", "complaint": "email.complained",
          "unsubscribe": "email.unsubscribed"}
# Enhanced status codes of a permanent failure that are about the address itself: the
# mailbox or domain does not exist (5.1.x: replies.names_no_mailbox), the mailbox is
# disabled (5.2.1, and 5.7.13 "User Account Disabled", the one 5.7.x code about the
# address), the domain has no mail route (5.4.4). Others (5.2.2 mailbox full, 5.3.4 too big,
# 5.6.x content) are about this message or are passing; 5.7.x is policy and never
# suppresses. Whole codes: Microsoft's 5.2.121 is a rate limit.
HARD_CODES = frozenset({"5.2.1", "5.4.4", "5.7.13"})
POLICY_CLASS = "5.7."
# A permanent reply and the enhanced code it begins with: `550 5.1.1`, `550-5.7.1`, `#5.1.1`.
REPLIED = re.compile(r"(?<![\w.-])5\d\d[ -]#?(5\.\d{1,3}\.\d{1,3})(?![\w-]|\.\d)")
# A basic SMTP reply code (RFC 5321) in a notice: `550 unknown user`, `452 mailbox full`.
REPLY_CODE = re.compile(r"(?<![\w.-])([45])[0-5]\d(?=[ -])")


@dataclass(frozen=True)
class Feedback:
    """One piece of feedback about one recipient, as a parser or a webhook read it.

    The keys that match it to the log row are whichever the source carried: `log_id` from
    a VERP token the caller has verified, `message_id` (postrelay's own Message-ID), or
    `queue_id` (the relay's id from its 250 reply). `original_recipient` is a DSN's
    Original-Recipient, the address before forwarding expanded it (an alias) into the
    recipient that failed. `vouched` says that `tenant_id` and
    `recipient` come from a token postrelay signed (an unsubscribe link), so the feedback
    may suppress without a log row.
    """

    kind: str
    source: str
    recipient: str | None = None
    original_recipient: str | None = None
    status: str | None = None  # enhanced status code, e.g. 5.1.1
    diagnostic: str | None = None
    source_event_id: str | None = None
    log_id: UUID | None = None
    message_id: str | None = None
    queue_id: str | None = None
    tenant_id: UUID | None = None
    category: str | None = None
    vouched: bool = False
    occurred_at: datetime | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in FEEDBACK_KINDS:
            raise ValidationError("kind", f"must be one of {', '.join(FEEDBACK_KINDS)}")
        if self.source not in SOURCES:
            raise ValidationError("source", f"must be one of {', '.join(SOURCES)}")
        if self.status is not None and not _STATUS.fullmatch(self.status):
            raise ValidationError("status", "an enhanced status code like 5.1.1")
        for name in QUOTED_FIELDS:  # what a mail server wrote need not be storable text
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, storable(value))
        for name in ("recipient", "original_recipient"):
            if getattr(self, name) is not None:
                self._set_address(name, normal_address(getattr(self, name)))
        if self.vouched and (self.tenant_id is None or not self.recipient):
            raise ValidationError("vouched", "a vouched report names its tenant and recipient")
        if self.message_id is not None:
            object.__setattr__(self, "message_id", normal_message_id(self.message_id))

    def _set_address(self, name: str, address: str) -> None:
        """An address longer than RFC 5321 allows is none postrelay sent to, and a long
        enough one would not fit the recipient index (its batch would fail whole, every
        time): the report names no such address, and keeps its start in `detail` for an
        operator."""
        if len(address) <= ADDRESS_MAX:
            object.__setattr__(self, name, address)
            return
        object.__setattr__(self, name, None)
        object.__setattr__(self, "detail", {**self.detail,
                                            f"{name}_too_long": address[:ADDRESS_MAX] + "…"})

    def dedupe_key(self) -> str:
        """The same for the same report delivered twice: the source's own id when it has
        one (callers without one pass a hash of what they received), with what the report
        says and about whom."""
        parts = (self.source, self.source_event_id or "", self.kind, self.recipient or "",
                 self.status or "", str(self.log_id or ""), self.message_id or "",
                 self.queue_id or "", str(self.tenant_id or ""), self.category or "")
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()


@dataclass(frozen=True)
class SuppressionPolicy:
    """Soft bounces suppress an address once `soft_limit` of them arrived within
    `soft_window_secs` (this one included)."""

    soft_limit: int = 3
    soft_window_secs: float = 7 * 86400.0

    @classmethod
    def from_settings(cls, settings: Settings) -> SuppressionPolicy:
        return cls(soft_limit=settings.email_soft_bounce_limit,
                   soft_window_secs=settings.email_soft_bounce_window_days * 86400.0)

    def __post_init__(self) -> None:
        if self.soft_limit < 1:
            raise ValidationError("email_soft_bounce_limit", "at least 1")
        if self.soft_window_secs <= 0:
            raise ValidationError("email_soft_bounce_window_days", "greater than 0")


@dataclass(frozen=True)
class Recorded:
    """What `record_feedback` did."""

    feedback_id: UUID | None  # None: the same feedback was recorded before
    duplicate: bool
    email_log_id: UUID | None = None
    tenant_id: UUID | None = None
    # verp, message_id, queue_id; token (a signed unsubscribe link); None: unmatched
    matched_by: str | None = None
    suppressed: bool = False
    resolved_unknown: bool = False
    completed_job: UUID | None = None
    event_type: str | None = None


def suppresses(kind: str, status: str | None, diagnostic: str | None = None) -> bool:
    """Whether this kind of feedback, once it names a message sent to the recipient, puts
    the address on the suppression list (soft bounces: only by count, see SuppressionPolicy).
    A bounce without a status is a provider's "permanent" verdict, which is about the
    address (a bounce by mail always has one: parse.py gives a notice without a code its
    reply's class). One whose status names no cause suppresses when its diagnostic says the
    mailbox does not exist (replies.refuses_mailbox: Yahoo's `554 delivery error: dd This
    user doesn't have a yahoo.com account`), and otherwise counts (counts_as_soft)."""
    if kind in ("complaint", "unsubscribe"):
        return True
    if kind != "bounced":
        return False
    if status is None:
        return True
    return refuses_mailbox(status, diagnostic) or status in HARD_CODES


def address_verdict(status: str | None) -> str | None:
    """The status of a provider's hard bounce (SES's Permanent, Postmark's HardBounce): a
    class-only code (5.0.0, `550 5.0.0 User unknown`) names no cause, and the bounce is the
    provider's verdict on the address itself: None, a hard bounce that suppresses."""
    return None if status is not None and status.endswith(".0.0") else status


def counts_as_soft(kind: str, status: str | None) -> bool:
    """Whether this report counts toward the soft-bounce limit (the insert statement of
    sql/feedback.sql counts the earlier ones by the same rule). Providers report some 5.7.x
    policy blocks as transient (SES's Transient, Postmark's SoftBounce): those never
    suppress, however many arrive, so they do not count either. A permanent failure whose
    code names no cause (replies.UNSPECIFIC) counts as a soft bounce does, unless its words
    made it a hard bounce (suppresses)."""
    if kind == "soft-bounced":
        return not (status or "").startswith(POLICY_CLASS)
    return kind == "bounced" and status is not None and UNSPECIFIC.fullmatch(status) is not None


def status_code(value: str | None, diagnostic: str | None) -> str | None:
    """A report's status code (a DSN's Status field, a provider's status); when it is only
    a class (x.0.0) and the diagnostic names a more specific one, that one. Exim, Microsoft
    and Amazon SES write 5.0.0 beside "550 5.1.1"; Exim also beside the "451 4.2.0" of a
    message that expired after temporary failures, which Postfix reports as 4.2.0: a soft
    bounce either way. A permanent failure takes the remote's own code, the one its reply
    gave, over a different one the reporting MTA wrote: sendmail writes `Status: 5.1.1`
    beside `550 5.7.1 IP address blacklisted` and beside `552 5.2.2 Over quota`, and a
    good address was suppressed."""
    given = ENHANCED.search(value or "")
    said = ENHANCED.search(diagnostic or "")
    if given and said and given.group(2, 3) == ("0", "0") and said.group(2, 3) != ("0", "0"):
        return said.group(0)
    replied = REPLIED.search(diagnostic or "")
    if given and replied and given.group(1) == "5":
        return replied.group(1)
    if given:
        return given.group(0)
    return said.group(0) if said else None


def notice_code(text: str | None) -> str | None:
    """The first enhanced status code of a notice's text, passing over class-only ones
    (5.0.0) while a specific one follows: Mimecast's `Status : 5.0.0` comes before the
    remote's `550 5.1.1`."""
    codes = [m.group(0) for m in ENHANCED.finditer(text or "")]
    return next((c for c in codes if not c.endswith(".0.0")), codes[0] if codes else None)


def reply_class(text: str | None) -> str | None:
    """The class of the first basic reply code a notice quotes (`550 unknown user`: 5.0.0,
    `452 mailbox full`: 4.0.0), for a notice that gives no enhanced code."""
    found = REPLY_CODE.search(text or "")
    return f"{found.group(1)}.0.0" if found else None


def normal_address(address: str) -> str:
    """An address as the log keeps its recipients (addresses.stored_form). Reports and
    providers may name an internationalized domain in Unicode (RFC 6533), and the same
    address read as another one matched no recipient: a hard bounce or a complaint about
    it suppressed nothing. A local part is left as it came: postrelay sends to ASCII ones
    only."""
    return stored_form(address.strip().strip("<>").strip())


def normal_message_id(message_id: str) -> str:
    """`<id@domain>` whatever the report's spacing or brackets."""
    core = message_id.strip().strip("<>").strip()
    return f"<{core}>"


def bounce_kind(status: str | None, diagnostic: str | None = None) -> str:
    """A failed delivery's kind by its status: transient failures (4.x.x) and a full
    mailbox (5.2.2, which receivers send for a passing state) are soft, and so is a failure
    with a code whose reply says the state is passing (replies.says_passing: Gmail's 5.2.1
    rate limit, a full mailbox answered with 5.1.1). A provider's verdict without a status
    stays a hard bounce."""
    if status is not None and (status.startswith("4.") or status == "5.2.2"
                               or says_passing(diagnostic)):
        return "soft-bounced"
    return "bounced"
