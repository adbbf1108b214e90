"""Bounce formats flufl.bounce does not know (detectors.py), on the notice's text."""

from __future__ import annotations

from postrelay.orchestrator.feedback.detectors import other_failures

DMA_REFUSED = """This is the DragonFly Mail Agent v0.13 at mx.relay.example.

There was an error delivering your mail to <Ann@Example.com>.

127.0.0.1 [127.0.0.1] did not like our RCPT TO:
550 5.1.1 <ann@example.com>: Recipient address rejected: User unknown

Message headers follow.
"""

DMA_GAVE_UP = """This is the DragonFly Mail Agent v0.13 at mx.relay.example.

There was an error delivering your mail to <cat@example.com>.

Could not deliver for the last 432000 seconds. Giving up.

Message headers follow.
"""


def test_dma_names_a_refused_recipient_as_failed_for_good():
    assert other_failures(DMA_REFUSED) == (set(), {b"ann@example.com"})


def test_dma_giving_up_after_its_retries_is_a_temporary_failure_that_lasted():
    assert other_failures(DMA_GAVE_UP) == ({b"cat@example.com"}, set())


def test_text_that_only_quotes_the_sentence_names_no_one():
    quoted = "> There was an error delivering your mail to <ann@example.com>.\n"
    assert other_failures(quoted) == (set(), set())
    assert other_failures("Hello Ann, welcome aboard.\n") == (set(), set())
