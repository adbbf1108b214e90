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
- Exchange Online's plain-text notice: "Delivery has failed to these recipients or
  groups:", then each address on a line of its own (`ann@example.com<mailto:…>`), then
  "Remote Server returned '550 5.1.1 …'" under "Diagnostic information for administrators".
"""

from __future__ import annotations

import re
from email.message import Message

from flufl.bounce import BounceDetector
from flufl.bounce._detectors import groupwise, microsoft, simplematch
from flufl.bounce._scan import _DETECTORS

DMA_FAILED = re.compile(r"^There was an error delivering your mail to <([^<>\s]+)>\.", re.M)
DMA_GAVE_UP = re.compile(r"^Could not deliver for the last \d+ seconds\. Giving up\.", re.M)
EXCHANGE_FAILED = re.compile(r"^Delivery has failed to these recipients or groups:[ \t]*\r?$"
                             r"(.*?)^Diagnostic information for administrators:", re.M | re.S)
# An address alone on its line, or before Exchange's `<mailto:…>` or `(…)`.
ADDRESS_LINE = re.compile(r"^[ \t]*([^\s<>()\"@]+@[^\s<>()\"@]+)[ \t]*(?:[<(].*)?\r?$", re.M)

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
    if not failed and (listed := EXCHANGE_FAILED.search(text)) is not None:
        failed = frozenset(m.group(1).lower().encode("utf-8", "replace")
                           for m in ADDRESS_LINE.finditer(listed.group(1)))
    return frozenset(), failed
