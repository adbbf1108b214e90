"""What an SMTP server said, and the errors the pool raises: `Reply` (code, enhanced status
code, text), the queue id of a 2xx reply, `Delivery`, and `SmtpError` with its leaves —
`SmtpTransient` (retry later), `SmtpAnswerLost`, `SmtpPermanent` (dead-letter), `SmtpConfigError`,
`SmtpThrottled`, `SmtpAuthFailed` and `SmtpPaused`. `classify` maps an aiosmtplib error at a
stage to one."""

from __future__ import annotations

import re
import ssl
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, TypeVar

import aiosmtplib

from postrelay.core.errors import PostrelayError

Stage = Literal["connect", "tls", "auth", "mail", "rcpt", "data"]
_MESSAGE_STAGES = frozenset({"mail", "rcpt", "data"})
_THROTTLE_CODES = frozenset({421, 454})
_ENHANCED = re.compile(r"^([245]\.\d{1,3}\.\d{1,3})(?:[ \t]+|$)")
# X.1.0 does not say whose address; X.1.7 and X.1.8 are the sender's (a refusal of ours).
_NOT_THE_RECIPIENTS = frozenset({"5.1.0", "5.1.7", "5.1.8"})
# A refusal that says the recipient's state is passing, whatever its code: vpopmail's `552
# sorry, mailbox … is over quota temporarily (#5.1.1)`, Gmail's `550-5.2.1 … is receiving
# mail at a rate that prevents additional messages`, GoDaddy's `550 5.1.1 … has sent to too
# many recipients this hour`, Postfix's `5.4.4` for a name server's malformed answer (the
# domain's DNS is broken, not gone). In lower case, matched against the text lowered: a
# pattern that ignores case is tried at every character of every bounce's reply.
_PASSING = re.compile(r"over ?quota|quota exceeded|mailbox (?:is )?full|receiving mail at a "
                      r"rate|too many (?:recipients|messages)|malformed or unexpected name "
                      r"server reply")
# Permanent failures whose code names no cause: `Status: 5.0.0` beside a bare `550 unknown
# user` (Postfix, Exim), sendmail's `553 5.3.0 Addressee unknown`, Outlook.com's `550 5.5.0
# mailbox unavailable`, but also a full disk or a refused message. 5.1.0 among them, which
# does not say whose address (Amazon SES's "5.1.0 - Unknown address error", a refused
# sender); not 5.7.0, a policy block. And 5.4.1, which Exchange Online answers for a
# recipient its directory does not have (`550 5.4.1 Recipient address rejected: Access
# denied`), and other hosts for one that does not answer. Their words decide
# (says_no_mailbox); else, repeated, they say the address takes no mail, and count toward
# the soft-bounce limit (feedback/model.py).
UNSPECIFIC = re.compile(r"5\.(?:[0-6]\.0|4\.1)")
# What MTAs and the large providers answer, where their code names no cause, for a mailbox
# or domain that does not exist: `550 User unknown`, `550 Recipient does not exist`,
# Yahoo's and AOL's `554 delivery error: dd This user doesn't have a yahoo.com account`,
# `554 … This account has been disabled`, Outlook.com's `550 5.5.0 Requested action not
# taken: mailbox unavailable`, sendmail's `553 5.3.0 Addressee unknown`, Exim's
# `unrouteable mail domain`. Lower case, as _PASSING.
_NO_MAILBOX = re.compile(
    r"(?:user|recipient|addressee) unknown|unknown (?:user|recipient|mailbox)|no such (?:user|"
    r"mailbox|recipient|address|domain)|(?:user|recipient|mailbox|address) not found|"
    r"(?:user|recipient|mailbox|address|account|rcpt)\b(?:[^.;:]|\.(?=\S)){0,80}? does(?: "
    r"not|n't) exist|doesn't have an? [\w.-]+ account|not a (?:known|valid) (?:user|"
    r"recipient|mailbox)|not an active address|no mail ?box|mailbox unavailable|(?:mailbox|"
    r"account) (?:is |has been )?(?:disabled|inactive)|unrouteable (?:mail )?domain|invalid "
    r"(?:recipient|mailbox)")
# Words that make such an answer about something other than the recipient's mailbox: the
# sender (Postfix's `Sender address rejected: User unknown in local recipient table`, a
# reply to MAIL FROM), a policy (`mailbox unavailable` is RFC 5321's text for any 550), or
# the message: a `User unknown` in reply to DATA is how some receivers (Japanese mobile
# carriers) refuse a sender their user filters out, and a `… does not exist` there may be
# about the sender's domain.
_NOT_THE_MAILBOX = re.compile(r"sender|mail from|\bdata\b|spam|block|polic|reputation|"
                              r"blacklist")
_REPLY_CODE = re.compile(r"^\d{3}[ -]")
# Conservative on purpose: a wrong queue id is worse than none. And at most 128 characters
# (the longest known, SES's, has about 60): the log's queue_id is indexed, and PostgreSQL
# refuses an index entry of more than 2704 bytes, which would leave a sent message's log
# row unwritten.
_QUEUE_ID_FORMS = (
    # Postfix, Mailpit, Haraka, many others: "Ok: queued as 4F3A2B"
    re.compile(r"\bqueued as:?\s+<?([A-Za-z0-9][\w.@-]{0,127}?)>?\.?(?:\s|$)",
               re.IGNORECASE),
    # Exim: "OK id=1tABCD-000123-XY"
    re.compile(r"^OK\s+id=([A-Za-z0-9][\w.-]{0,127})\s*$", re.IGNORECASE),
    # Sendmail: "4BXYZ123 Message accepted for delivery"
    re.compile(r"^([A-Za-z0-9]{8,128})\s+Message accepted for delivery", re.IGNORECASE),
    # Amazon SES: "Ok 0100018c8f2f1a2b-3c4d5e6f-0000-0000" (a bare "Ok <word>" is not enough)
    re.compile(r"^Ok\s+(?=[0-9a-f-]{1,128}\s*$)([0-9a-f]{16,}(?:-[0-9a-f]+)+)\s*$",
               re.IGNORECASE),
)


def names_no_mailbox(enhanced: str | None) -> bool:
    """Whether a permanent failure's code says the recipient's mailbox or domain does not
    exist (5.1.x), the rule by which both a refusal at send time and a later bounce
    suppress the address. Not 5.1.0, which does not say whose address, nor 5.1.7 and 5.1.8,
    the sender's: a refusal of the sending domain (`553 5.1.8 Domain of sender address
    does not exist`) suppressed every recipient it was sent to."""
    code = enhanced or ""
    return code.startswith("5.1.") and code not in _NOT_THE_RECIPIENTS


def refuses_mailbox(enhanced: str | None, text: str | None) -> bool:
    """Whether a permanent failure says the recipient's mailbox or domain does not exist,
    the rule by which both a refusal at send time and a later bounce suppress the address:
    by its code (names_no_mailbox), or, where its code names none (no code, UNSPECIFIC), by
    its words (says_no_mailbox)."""
    if names_no_mailbox(enhanced):
        return True
    return (enhanced is None or UNSPECIFIC.fullmatch(enhanced) is not None) and \
        says_no_mailbox(text)


def says_no_mailbox(text: str | None) -> bool:
    """Whether a refusal's words say the recipient's mailbox or domain does not exist, and
    are not about the sender, a policy or a passing state (says_passing)."""
    if text is None:
        return False
    lowered = text.lower()
    return _NO_MAILBOX.search(lowered) is not None and \
        _NOT_THE_MAILBOX.search(lowered) is None and _PASSING.search(lowered) is None


def says_passing(text: str | None) -> bool:
    """Whether a refusal's text says the recipient's state is passing (a full mailbox, a
    rate limit), whatever its code: the rule by which neither a refusal at send time nor a
    later bounce suppresses such an address at once."""
    return text is not None and _PASSING.search(text.lower()) is not None


@dataclass(frozen=True)
class Reply:
    """One SMTP reply: `Reply.parse(550, "5.1.1 No such user")` is
    `Reply(code=550, enhanced="5.1.1", text="No such user")`."""

    code: int
    enhanced: str | None
    text: str

    @classmethod
    def parse(cls, code: int, message: str) -> Reply:
        lines = message.strip().splitlines() or [""]
        found = _ENHANCED.match(lines[0])
        if found is None:
            return cls(code, None, "\n".join(lines))
        # Multi-line replies repeat the enhanced code on every line.
        return cls(code, found.group(1), "\n".join(_ENHANCED.sub("", x, count=1) for x in lines))

    def __str__(self) -> str:
        return " ".join(str(p) for p in (self.code, self.enhanced, self.text) if p)


def queue_id_from(reply_text: str) -> str | None:
    """The server's queue id in its reply to DATA, or None when the form is not a known one.

    >>> queue_id_from("2.0.0 Ok: queued as 4F3A2B")
    '4F3A2B'
    """
    text = _REPLY_CODE.sub("", reply_text.strip(), count=1)
    text = _ENHANCED.sub("", text, count=1).strip()
    for form in _QUEUE_ID_FORMS:
        found = form.search(text)
        if found:
            return found.group(1)
    return None


@dataclass(frozen=True)
class Delivery:
    """The server accepted the message for `accepted`; `reply` is its answer to DATA."""

    accepted: tuple[str, ...]
    refused: Mapping[str, Reply]
    reply: Reply
    queue_id: str | None


class SmtpError(PostrelayError):
    """A send failed at `stage`; `reply` is what the server said (None: it said nothing, e.g.
    the connection was lost); `refused` holds per-recipient refusals when known."""

    def __init__(self, message: str, *, stage: Stage, reply: Reply | None = None,
                 refused: Mapping[str, Reply] | None = None) -> None:
        super().__init__(message)
        self.stage = stage
        self.reply = reply
        self.refused: Mapping[str, Reply] = MappingProxyType(dict(refused or {}))


class SmtpTransient(SmtpError):
    """4xx, connection lost, timeout, TLS or connection trouble: retry later."""


class SmtpAnswerLost(SmtpTransient):
    """The message went to the server (after DATA's 354, or as a BDAT chunk) and no answer
    came back (the connection dropped, the reply timed out or could not be read), or one
    that is neither a success nor a refusal (a 1xx or 3xx): the server may have accepted
    it. The attempt's outcome is unknown."""


class SmtpPermanent(SmtpError):
    """5xx to this message or its envelope: dead-letter it."""


class SmtpConfigError(SmtpPermanent):
    """The server cannot be used as configured (STARTTLS or AUTH is required, and it speaks
    only HELO, which offers neither), or cannot take this message (larger than its SIZE):
    nothing was sent, and no retry changes that until the settings, the server or the
    message do. `reply` is the server's refusal of EHLO, if any."""


class SmtpThrottled(SmtpTransient):
    """421 or 454: the pool waits `throttle_secs` before its next send."""


class SmtpAuthFailed(SmtpTransient):
    """AUTH failed (535 and the like): the pool stops sending for `auth_pause_secs`."""


class SmtpPaused(SmtpTransient):
    """Raised at once, without connecting, while an auth pause is in force."""

    def __init__(self, remaining_secs: float) -> None:
        super().__init__(f"auth: sending paused for {remaining_secs:.1f}s after an "
                         "authentication failure", stage="auth")
        self.remaining_secs = remaining_secs


def classify(exc: BaseException, stage: Stage,
             refused: Mapping[str, Reply] | None = None) -> SmtpError:
    """Map an aiosmtplib (or socket) error at `stage` to the SmtpError the caller acts on."""
    if isinstance(exc, aiosmtplib.SMTPResponseException) and exc.code >= 400:
        reply = Reply.parse(exc.code, exc.message)
        kind: type[SmtpError] = SmtpTransient
        if reply.code in _THROTTLE_CODES:
            kind = SmtpThrottled
        elif stage == "auth" or reply.code == 535 or (reply.code, reply.enhanced) == (530, "5.7.0"):
            kind = SmtpAuthFailed  # 530 5.7.0 is RFC 4954's "authentication required"
        elif reply.code >= 500 and stage in _MESSAGE_STAGES:
            # Only a verdict on the message is permanent; a 5xx greeting is the server's state.
            kind = SmtpPermanent
        return kind(f"{stage}: {reply}", stage=stage, reply=reply, refused=refused)
    if stage == "auth":  # e.g. the server offers no AUTH at all
        return SmtpAuthFailed(f"auth: {exc}", stage=stage, refused=refused)
    if stage == "connect" and _caused_by_tls(exc):
        stage = "tls"
    what = "timed out" if isinstance(exc, TimeoutError) else (str(exc) or type(exc).__name__)
    return SmtpTransient(f"{stage}: {what}", stage=stage, refused=refused)


def _caused_by_tls(exc: BaseException | None) -> bool:
    while exc is not None:
        if isinstance(exc, ssl.SSLError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


_T = TypeVar("_T")


async def step(stage: Stage, op: Awaitable[_T],
               refused: dict[str, Reply] | None = None) -> _T:
    """Await one SMTP step, turning aiosmtplib's errors into ours for `stage`."""
    try:
        return await op
    except (aiosmtplib.SMTPException, OSError) as exc:
        raise classify(exc, stage, refused) from exc
