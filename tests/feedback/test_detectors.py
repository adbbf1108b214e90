"""Bounce formats flufl.bounce does not know (detectors.py), on the notice's text."""

from __future__ import annotations

import pytest

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


# Notices in the shapes their MTAs write, each naming ann@example.com as failed.
NOTICES = {
    "Lotus Notes": """Your message

  Subject: Welcome, Ann!

was not delivered to:

  ann@example.com

because:

  User ann (ann@example.com) not listed in Domino Directory

------- Failure Reasons  --------

User ann (ann@example.com) not listed in Domino Directory
ann@example.com


------- Returned Message --------
""",
    "OpenSMTPD before its DSN": """Hi!

This is the MAILER-DAEMON, please DO NOT REPLY to this e-mail.

An error has occurred while attempting to deliver a message for
the following list of recipients:

ann@example.com: 550 5.1.1 <ann@example.com>... User Unknown

Below is a copy of the original message:
""",
    "MailMarshal": """Your message could not be delivered.

The following recipients were affected:
    ann@example.com

Additional information follows:
550 5.1.1 <ann@example.com>... User unknown
""",
    "InterScan MSS": """The following message could not be delivered:

Sent <<< RCPT TO:<ann@example.com>
Received >>> 550 5.1.1 <ann@example.com>... User unknown

Unable to deliver message to <ann@example.com>.
""",
    "m-FILTER": """以下のメールアドレスへの送信に失敗しました。
ann@example.com

-------server message
550 5.1.1 <ann@example.com>... User unknown
""",
    "GroupWise": """The message that you sent was undeliverable to the following:

	ann@example.com (user not found)


""",
}


@pytest.mark.parametrize("notice", NOTICES.values(), ids=NOTICES.keys())
def test_plain_text_notices_name_their_failed_address(notice):
    """Notices no flufl.bounce detector knows: each bounce was `unparsed`, and the dead
    address went on getting mail."""
    assert other_failures(notice) == (set(), {b"ann@example.com"})


def test_a_notices_heading_without_its_list_names_no_one():
    """A heading alone (an out-of-office quoting one, a notice cut short) is no failure:
    a section is read only between its heading and its end."""
    for text in ("------- Failure Reasons  --------\nann@example.com\n",
                 "An error has occurred while attempting to deliver a message for the "
                 "following list of recipients:\nann@example.com: 550 unknown\n",
                 "> Sent <<< RCPT TO:<ann@example.com>\n> Received >>> 550 unknown\n",
                 "> The message that you sent was undeliverable to the following:\n>\n"
                 ">\tann@example.com (user not found)\n"):
        assert other_failures(text) == (set(), set())
