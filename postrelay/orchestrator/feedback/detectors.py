"""Detectors of bounces in formats of their own: GNU Mailman's (flufl.bounce), and those
for formats they do not know, read the way they read theirs: a pattern that names the
failed address in the notice's text. Both answer as flufl's `all_failures` does: the
addresses that failed for now and for good, as bytes.

    temporary, permanent = flufl_failures(msg)     # the bounce as email parsed it
    temporary, permanent = other_failures(text)   # the notice's text parts, decoded

- DragonFly Mail Agent (dma): a plain-text notice, "There was an error delivering your mail
  to <ann@example.com>." followed by the server's reply (a permanent refusal), or by "Could
  not deliver for the last 432000 seconds. Giving up." once its retries of a temporary
  failure ran out.
- Plain-text notices that list the failed addresses under a heading of their own
  (NOTICES): Exchange Online's ("Delivery has failed to these recipients or groups:", each
  address on a line of its own, `ann@example.com<mailto:…>`, then "Remote Server returned
  '550 5.1.1 …'"), Lotus Notes' and Domino's ("------- Failure Reasons --------"),
  OpenSMTPD's before its DSN ("…the following list of recipients:", then `ann@…: 550 …`),
  Trustwave MailMarshal's ("The following recipients were affected:"), Trend Micro InterScan
  MSS's transcript (`Sent <<< RCPT TO:<ann@…>`, `Received >>> 550 …`), m-FILTER's
  (Japanese: the address on the line after its sentence) and Novell GroupWise's ("The
  message that you sent was undeliverable to the following:", then `ann@… (user not
  found)`).
- Yahoo's notice, qmail's format under another first line ("Sorry, we were unable to
  deliver your message to the following address."): flufl's qmail detector, told that line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from email.message import Message

from flufl.bounce import BounceDetector
from flufl.bounce._detectors import groupwise, microsoft, qmail, simplematch
from flufl.bounce._scan import _DETECTORS

DMA_FAILED = re.compile(r"^There was an error delivering your mail to <([^<>\s]+)>\.", re.M)
DMA_GAVE_UP = re.compile(r"^Could not deliver for the last \d+ seconds\. Giving up\.", re.M)
ADDRESS = r"[^\s<>()\"@:,]+@[^\s<>()\"@:,]+"
# An address alone on its line, or before Exchange's `<mailto:…>` or `(…)`.
ADDRESS_LINE = re.compile(rf"^[ \t]*({ADDRESS})[ \t]*(?:[<(].*)?\r?$", re.M)


@dataclass(frozen=True)
class Notice:
    """A plain-text notice that lists the failed addresses: the section that lists them
    (its group 1; the whole text without one), and each address in it (group 1)."""

    section: re.Pattern[str] | None
    address: re.Pattern[str]

    def failed(self, text: str) -> list[str]:
        if self.section is not None:
            listed = self.section.search(text)
            if listed is None:
                return []
            text = listed.group(1)
        return [m.group(1) for m in self.address.finditer(text)]


NOTICES = (
    Notice(re.compile(r"^Delivery has failed to these recipients or groups:[ \t]*\r?$(.*?)"
                      r"^Diagnostic information for administrators:", re.M | re.S),
           ADDRESS_LINE),  # Exchange Online
    Notice(re.compile(r"^-+ Failure Reasons +-+[ \t]*\r?$(.*?)^-+ Returned Message +-+",
                      re.M | re.S), ADDRESS_LINE),  # Lotus Notes, Domino
    Notice(re.compile(r"An error has occurred while attempting to deliver a message for\s+the "
                      r"following list of recipients:(.*?)Below is a copy of the original "
                      r"message:", re.S),
           re.compile(rf"^({ADDRESS}): ", re.M)),  # OpenSMTPD before its DSN
    Notice(re.compile(r"^The following recipients were affected:[ \t]*\r?$(.*?)"
                      r"(?:^[ \t]*\r?$|\Z)", re.M | re.S), ADDRESS_LINE),  # MailMarshal
    Notice(None, re.compile(rf"^Sent <<< RCPT TO:<({ADDRESS})>[ \t]*\r?\n"
                            r"Received >>> 5\d\d", re.M)),  # InterScan MSS
    Notice(None, re.compile(r"^以下のメールアドレスへの送信に失敗しました。[ \t]*\r?\n"
                            rf"[ \t]*({ADDRESS})[ \t]*\r?$", re.M)),  # m-FILTER
    # The lines after the heading (and the blank ones before them), up to a blank line.
    Notice(re.compile(r"^The message that you sent was undeliverable to the following:[ \t]*"
                      r"\r?\n(?:[ \t]*\r?\n)*((?:[ \t]*\S[^\n]*\n?)+)", re.M),
           ADDRESS_LINE),  # GroupWise
)

Failures = tuple[frozenset[bytes], frozenset[bytes]]

# flufl.bounce's detectors in its order, but for its last resort, LLNL (one site's custom
# Sendmail of the 1990s), which takes any line holding `, someone@example.com,` for a
# permanent failure: an out-of-office's signature or the colleague it names, and the
# address was suppressed. flufl.bounce offers no public list of its detectors.
DETECTORS: tuple[type[BounceDetector], ...] = tuple(
    d for d in _DETECTORS if d.__name__ != "LLNL")

# The check three of them make of each address they find (flufl.bounce 6.0.0's
# simplematch.VALID) takes a domain of lower-case letters, digits and dots only: the failed
# address of every Exim-style bounce to a domain with a hyphen (t-online.de) or written in
# capitals was dropped, and the bounce went unread. Theirs, with those.
VALID = re.compile(rb"^[\x21-\x3d\x3f\x41-\x7e]+@[A-Za-z0-9._-]+$")
for _reader in (simplematch, groupwise, microsoft):
    _reader.VALID = VALID  # type: ignore[attr-defined]
# Yahoo writes qmail's notice (QSBMF) after a first line of its own; flufl's qmail detector
# knows a notice by its first line, and the failed address of Yahoo's was not read.
YAHOO_QMAIL = "Sorry, we were unable to deliver your message"
if YAHOO_QMAIL not in qmail.introtags:
    qmail.introtags.append(YAHOO_QMAIL)


def flufl_failures(msg: Message) -> Failures:
    """flufl.bounce's detectors but LLNL (DETECTORS). Its Yale detector (6.0.0) fails on
    a single-part message without a From (an IndexError, and no detector after it runs);
    they all read the null address as no From, so such a message is shown them with one,
    and given back as it came."""
    if "from" in msg or msg.is_multipart():
        return _first_failures(msg)
    msg["From"] = "<>"
    try:
        return _first_failures(msg)
    finally:
        del msg["From"]


def _first_failures(msg: Message) -> Failures:
    """What the first of DETECTORS that finds any failure finds, as flufl's all_failures."""
    for detector in DETECTORS:
        temporary, permanent = detector().process(msg)
        if temporary or permanent:
            return frozenset(temporary), frozenset(permanent)
    return frozenset(), frozenset()


def other_failures(text: str) -> Failures:
    failed = frozenset(m.group(1).lower().encode("utf-8", "replace")
                       for m in DMA_FAILED.finditer(text))
    if DMA_GAVE_UP.search(text):
        return failed, frozenset()
    for notice in () if failed else NOTICES:
        if found := notice.failed(text):
            failed = frozenset(a.lower().encode("utf-8", "replace") for a in found)
            break
    return frozenset(), failed
