"""Bounce formats that flufl.bounce's detectors do not know, read the way they read theirs:
a pattern that names the failed address in the notice's text. The answer has the shape of
flufl's `all_failures`: the addresses that failed for now and for good, as bytes.

    temporary, permanent = other_failures(text)   # the notice's text parts, decoded

- DragonFly Mail Agent (dma): a plain-text notice, "There was an error delivering your mail
  to <ann@example.com>." followed by the server's reply (a permanent refusal), or by "Could
  not deliver for the last 432000 seconds. Giving up." once its retries of a temporary
  failure ran out.
"""

from __future__ import annotations

import re

DMA_FAILED = re.compile(r"^There was an error delivering your mail to <([^<>\s]+)>\.", re.M)
DMA_GAVE_UP = re.compile(r"^Could not deliver for the last \d+ seconds\. Giving up\.", re.M)

Failures = tuple[frozenset[bytes], frozenset[bytes]]


def other_failures(text: str) -> Failures:
    failed = frozenset(m.group(1).lower().encode("utf-8", "replace")
                       for m in DMA_FAILED.finditer(text))
    if DMA_GAVE_UP.search(text):
        return failed, frozenset()
    return frozenset(), failed
