"""The feedback parser on reports in the formats real MTAs and mailbox providers send."""

from __future__ import annotations

import logging
import uuid

import pytest

from postrelay.orchestrator.feedback import Feedback
from postrelay.orchestrator.feedback.parse import parse_mail
from tests.feedback.conftest import BOUNCE_DOMAIN, bounce_mail

MID = "<0b7c6a52-8f7e-4d1a-9a0b-2b1f3c4d5e6f@mail.acme.example>"
ANN = "ann@example.com"


@pytest.mark.parametrize(("name", "kind", "status", "fmt"), [
    ("postfix_bounce.eml", "bounced", "5.1.1", "dsn"),
    ("postfix_delayed.eml", "delayed", "4.4.1", "dsn"),
    ("postfix_delivered.eml", "delivered", "2.0.0", "dsn"),
    ("m365_ndr.eml", "bounced", "5.1.10", "dsn"),
    ("gmail_bounce.eml", "bounced", "5.1.1", "dsn"),
    ("exim_bounce.eml", "bounced", "5.1.1", "non-standard"),
    ("yahoo_bounce.eml", "bounced", "5.0.0", "non-standard"),
    ("yahoo_arf.eml", "complaint", None, "arf"),
])
def test_reports_name_kind_status_recipient_and_message(return_path, name, kind, status, fmt):
    log_id = uuid.uuid4()
    (report,) = parse_mail(bounce_mail(name, verp=return_path.address(log_id), message_id=MID),
                           return_path=return_path)
    assert (report.kind, report.status, report.recipient) == (kind, status, ANN)
    assert report.log_id == log_id and report.message_id == MID
    assert report.detail["format"] == fmt
    assert report.source_event_id  # the report's own Message-ID: its duplicate is known


def test_yahoos_notice_of_a_refusal_by_another_host_is_read(return_path):
    """Yahoo writes qmail's notice under a first line of its own; from one of its hosts
    (not yahoo.com itself, which flufl.bounce's Yahoo detector knows), with the remote
    host's reply, no detector read it, and the hard bounce was `unparsed`."""
    raw = bounce_mail("yahoo_bounce.eml", verp=return_path.address(uuid.uuid4()),
                      message_id=MID).replace(
        b"From: MAILER-DAEMON@yahoo.com", b"From: MAILER-DAEMON@mta1034.mail.ne1.yahoo.com")
    start = raw.index(b"554: delivery error")
    end = raw.index(b"\r\n", start)
    raw = raw[:start] + b"74.6.137.21 does not like recipient.\r\nRemote host said: 550 " \
        b"5.1.1 <ann@example.com>: Recipient address rejected: User unknown\r\n" \
        b"Giving up on 74.6.137.21." + raw[end:]
    (report,) = parse_mail(raw, return_path=return_path)
    assert (report.kind, report.status, report.recipient) == ("bounced", "5.1.1", ANN)


def test_a_postfix_report_carries_the_relays_queue_id(return_path):
    (report,) = parse_mail(bounce_mail("postfix_bounce.eml", verp="x@nowhere.example",
                                       message_id=MID, queue_id="9QQ1"), return_path=None)
    assert (report.queue_id, report.log_id, report.message_id) == ("9QQ1", None, MID)
    assert "User unknown" in report.diagnostic


def test_an_action_with_a_comment_is_read_by_its_value(return_path):
    """sendmail writes `Action: relayed (to non-DSN-aware mailer)` (RFC 3464 allows the
    comment): still a delivery report, not a block to skip."""
    raw = bounce_mail("postfix_delivered.eml", verp=return_path.address(uuid.uuid4()),
                      message_id=MID).replace(b"Action: relayed",
                                              b"Action: relayed (to non-DSN-aware mailer)")
    (report,) = parse_mail(raw, return_path=return_path)
    assert (report.kind, report.status, report.detail["action"]) == \
        ("delivered", "2.0.0", "relayed")


def test_a_redacted_complaint_leaves_the_recipient_to_the_match(return_path):
    (report,) = parse_mail(bounce_mail("jmrp_redacted.eml", verp="-", message_id=MID),
                           return_path=return_path)
    assert (report.kind, report.recipient, report.message_id) == ("complaint", None, MID)
    assert report.detail["feedback_type"] == "abuse"


def test_an_out_of_office_reply_is_an_auto_reply(return_path):
    log_id = uuid.uuid4()
    (report,) = parse_mail(bounce_mail("out_of_office.eml", verp=return_path.address(log_id),
                                       message_id=MID), return_path=return_path)
    assert (report.kind, report.recipient, report.log_id) == ("auto-reply", ANN, log_id)


def reply_without_auto_submitted(return_path, subject: bytes, marker: bytes) -> Feedback:
    """The out-of-office fixture under `subject`, its Auto-Submitted (and Microsoft's
    header) replaced by the header line `marker`, as read."""
    raw = bounce_mail("out_of_office.eml", verp=return_path.address(uuid.uuid4()),
                      message_id=MID).replace(
        b"Subject: Automatic reply: Welcome, Ann!", b"Subject: " + subject).replace(
        b"Auto-Submitted: auto-replied\r\nX-Auto-Response-Suppress: All", marker)
    (report,) = parse_mail(raw, return_path=return_path)
    return report


def test_a_mail_systems_notice_marked_bulk_is_no_auto_reply(return_path):
    """Old MTAs mark their notices `Precedence: bulk`, as vacation(1) marks its replies: a
    notice no reader understands, from a mail system under a name of its own ("Jetmail
    System" <>), must stay `unparsed` for an operator, not be ignored as an auto-reply."""
    report = reply_without_auto_submitted(return_path, b"Mail Error", b"Precedence: bulk")
    assert report.kind == "unparsed"


def test_icloud_s_vacation_reply_is_an_auto_reply(return_path):
    """It has no Auto-Submitted and says "Auto reply:": it was `unparsed`."""
    report = reply_without_auto_submitted(return_path, b"Re: Welcome, Ann!",
                                          b"X-Apple-Action: VACATION")
    assert (report.kind, report.recipient) == ("auto-reply", ANN)


def test_a_complaint_naming_two_recipients_is_a_complaint_about_each(return_path):
    """Original-Rcpt-To may come more than once (RFC 5965 3.2): only the first was taken,
    so which address a complaint suppressed depended on the order of the fields."""
    raw = bounce_mail("yahoo_arf.eml", verp="-", message_id=MID).replace(
        b"Original-Rcpt-To: ann@example.com\r\n",
        b"Original-Rcpt-To: bob@example.com\r\nOriginal-Rcpt-To: ann@example.com\r\n")
    reports = parse_mail(raw, return_path=return_path)
    assert [(r.kind, r.recipient) for r in reports] == [
        ("complaint", "bob@example.com"), ("complaint", ANN)]

def test_a_jmrp_complaint_in_microsofts_own_format_is_a_complaint(return_path):
    """Not ARF: the reported message attached whole, its recipient in the header
    Outlook.com adds; sent to the address registered with JMRP, so the attached
    Return-Path carries the token."""
    log_id = uuid.uuid4()
    (report,) = parse_mail(bounce_mail("jmrp_attached.eml", verp=return_path.address(log_id),
                                       message_id=MID), envelope_to=[f"fbl@{BOUNCE_DOMAIN}"],
                           return_path=return_path)
    assert (report.kind, report.recipient, report.log_id, report.message_id) == (
        "complaint", "ann@hotmail.com", log_id, MID)
    assert report.detail["format"] == "jmrp"

@pytest.mark.parametrize("name", ["ooo_exchange_signature.eml", "vacation_sieve_colleague.eml",
                                  "ooo_quoting_original.eml"])
def test_an_address_in_an_out_of_office_text_is_no_failed_recipient(return_path, name):
    """A signature (`Ann Example, Head of Procurement, ann@…, +44…`), a colleague named
    between commas, a quoted original's To line: flufl.bounce's LLNL detector took each
    for a permanent failure, and the address was suppressed."""
    log_id = uuid.uuid4()
    (report,) = parse_mail(bounce_mail(name, verp=return_path.address(log_id),
                                       message_id=MID), return_path=return_path)
    assert (report.kind, report.recipient, report.log_id) == ("auto-reply", ANN, log_id)


QMAIL_NOTICE = b"""Subject: failure notice

Hi. This is the qmail-send program at mx.example.
I'm afraid I wasn't able to deliver your message to the following addresses.
This is a permanent error; I've given up. Sorry it didn't work out.

<ann@example.com>:
192.0.2.1 does not like recipient.
Remote host said: 550 5.1.1 User unknown
Giving up on 192.0.2.1.
"""


@pytest.mark.parametrize(("raw", "kind"), [
    (QMAIL_NOTICE, "bounced"),
    (b"Subject: Out of office\nAuto-Submitted: auto-replied\n\nAway until Monday.\n",
     "auto-reply"),
    (b"Subject: cheap watches\n\nBuy now.\n", "unparsed"),
])
def test_a_message_without_a_from_is_still_read_by_every_detector(return_path, caplog, raw,
                                                                  kind):
    """flufl.bounce 6.0.0's Yale detector raises on a single-part message without a From,
    which stopped the detectors after it and logged a traceback."""
    verp = return_path.address(uuid.uuid4())
    (report,) = parse_mail(b"To: " + verp.encode() + b"\n" + raw, return_path=return_path)
    assert report.kind == kind
    assert "unreadable" not in report.detail.get("reason", "")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_tampered_token_names_no_message_and_says_so(return_path):
    address = return_path.address(uuid.uuid4())
    tampered = address.replace("bounce-", "bounce-a", 1).replace("@", "", 0)
    (report,) = parse_mail(bounce_mail("postfix_bounce.eml", verp=tampered, message_id=MID),
                           return_path=return_path)
    assert report.log_id is None and "verp_refused" in report.detail


@pytest.mark.parametrize("raw", [
    b"",
    b"\x00\xff\xfe garbage that is no message at all",
    b"Subject: hello\r\n\r\njust a note",
    b"Content-Type: multipart/report; report-type=delivery-status; boundary=x\r\n\r\n--x\r\n"
    b"Content-Type: message/delivery-status\r\n\r\nReporting-MTA: dns; mx\r\n",  # truncated
    b"Content-Type: multipart/report; report-type=disposition-notification; boundary=y\r\n\r\n",
])
def test_malformed_or_truncated_mail_is_unparsed_never_an_error(return_path, raw):
    (report,) = parse_mail(raw, return_path=return_path)
    assert report.kind == "unparsed" and report.detail["reason"]


def test_a_truncated_dsn_keeps_what_it_could_read(return_path):
    whole = bounce_mail("postfix_bounce.eml", verp=return_path.address(uuid.uuid4()),
                        message_id=MID)
    reports = parse_mail(whole[: whole.index(b"Action: failed")], return_path=return_path)
    assert [r.kind for r in reports] in (["unparsed"], ["bounced"])  # never an exception


def test_an_oversized_message_is_unparsed_with_its_headers(return_path):
    raw = bounce_mail("postfix_bounce.eml", verp=return_path.address(uuid.uuid4()),
                      message_id=MID) + b"x" * (10 * 1024 * 1024)
    (report,) = parse_mail(raw, return_path=return_path, max_bytes=5 * 1024 * 1024)
    assert report.kind == "unparsed" and "over the" in report.detail["reason"]
    assert report.detail["headers"]["subject"] == "Undelivered Mail Returned to Sender"
    assert report.log_id is not None  # its Delivered-To still names the message


@pytest.mark.parametrize("name", ["hotmail_delay.eml", "messagingserver_delay.eml"])
def test_a_delay_warning_with_4_4_7_is_a_delay(return_path, name):
    """Microsoft and Oracle's Messaging Server (iCloud) warn of a delay with Status 4.4.7
    ("THIS IS A WARNING MESSAGE ONLY", "delivery attempts will continue"); taken for an
    expired message, three warnings suppressed an address whose mail was still on its way.
    OpenSMTPD's expired envelope (real-MTA replay) says "Envelope expired": a soft bounce."""
    (report,) = parse_mail(bounce_mail(name, verp=return_path.address(uuid.uuid4()),
                                       message_id=MID), return_path=return_path)
    assert (report.kind, report.status, report.recipient) == ("delayed", "4.4.7", ANN)


@pytest.mark.parametrize(("name", "status"), [("aol_one_block.eml", "5.4.4"),
                                              ("mimecast_bounce.eml", "5.1.1")])
def test_a_status_part_not_in_blocks_is_still_read(return_path, name, status):
    """AOL writes the message's and the recipient's fields in one block; Mimecast writes
    `Action : failed` (a blank before the colon), which email reads as no field at all.
    Both were kept `unparsed`, their bounces lost: AOL's block is read as the recipient's,
    Mimecast's notice by the bounce detectors."""
    log_id = uuid.uuid4()
    (report,) = parse_mail(bounce_mail(name, verp=return_path.address(log_id),
                                       message_id=MID), return_path=return_path)
    assert (report.kind, report.recipient, report.log_id) == ("bounced", ANN, log_id)
    assert report.status == status


def test_each_recipient_of_a_plain_text_bounce_gets_its_own_code(return_path):
    """qmail names each recipient in a paragraph of its own with the remote's reply; every
    recipient took the notice's first code, so a full mailbox listed before an unknown user
    made both soft bounces (and the other way round, both hard)."""
    raw = bounce_mail("qmail_two_recipients.eml", verp=return_path.address(uuid.uuid4()),
                      message_id=MID, other="bob@example.com")
    reports = {r.recipient: (r.kind, r.status) for r in parse_mail(raw,
                                                                   return_path=return_path)}
    assert reports == {ANN: ("soft-bounced", "5.2.2"), "bob@example.com": ("bounced", "5.1.1")}


def test_each_recipient_of_aols_one_block_is_reported(return_path):
    """AOL writes the message's and every recipient's fields in one block: only the first
    recipient was read, and a second, dead address was never reported."""
    raw = bounce_mail("aol_one_block.eml", verp=return_path.address(uuid.uuid4()),
                      message_id=MID).replace(
        b"type=A: Host not found\r\n", b"type=A: Host not found\r\n"
        b"Final-Recipient: rfc822; bob@example.com\r\n"
        b"Original-Recipient: rfc822;bob@example.com\r\nAction: failed\r\n"
        b"Status: 5.1.1\r\nDiagnostic-Code: smtp; 550 5.1.1 <bob@example.com>: unknown\r\n")
    reports = parse_mail(raw, return_path=return_path)
    assert [(r.recipient, r.kind, r.status) for r in reports] == [
        (ANN, "bounced", "5.4.4"), ("bob@example.com", "bounced", "5.1.1")]


def test_a_continuation_line_without_its_blank_does_not_end_the_block(return_path):
    """MessageLabs writes a Diagnostic-Code's further `550 …` lines without a leading
    blank, before the Final-Recipient: email ended the block's fields there, the recipient
    was lost, and the hard bounce was `unparsed`."""
    raw = bounce_mail("postfix_bounce.eml", verp=return_path.address(uuid.uuid4()),
                      message_id=MID)
    start = raw.index(b"Final-Recipient:")
    end = raw.index(b"\r\n\r\n", start)
    raw = raw[:start] + (
        b"Diagnostic-Code: smtp; 550-5.1.1 <ann@example.com>: Recipient address rejected:\r\n"
        b"550 5.1.1 User unknown in virtual mailbox table\r\nStatus: 5.1.1\r\n"
        b"Action: failed\r\nFinal-Recipient: rfc822; ann@example.com") + raw[end:]
    (report,) = parse_mail(raw, return_path=return_path)
    assert (report.kind, report.status, report.recipient) == ("bounced", "5.1.1", ANN)
    assert report.diagnostic.endswith("550 5.1.1 User unknown in virtual mailbox table")


@pytest.mark.parametrize("original", [True, False],
                         ids=["original recipient", "x-failed-recipients"])
def test_a_failed_local_delivery_names_the_address_not_the_pipe(return_path, original):
    """Exim's report of a local delivery names the pipe or file it failed to write to as
    the Final-Recipient: that was taken for the recipient, and the dead address was not
    suppressed. The address is the Original-Recipient, else Exim's X-Failed-Recipients."""
    raw = bounce_mail("postfix_bounce.eml", verp=return_path.address(uuid.uuid4()),
                      message_id=MID).replace(
        b"Final-Recipient: rfc822; ann@example.com",
        b"Final-Recipient: rfc822;|/usr/local/bin/deliver ann@example.com").replace(
        b"Auto-Submitted:", b"X-Failed-Recipients: ann@example.com\r\nAuto-Submitted:")
    if not original:
        raw = raw.replace(b"Original-Recipient: rfc822;ann@example.com\r\n", b"")
    (report,) = parse_mail(raw, return_path=return_path)
    assert (report.recipient, report.kind, report.status) == (ANN, "bounced", "5.1.1")


def test_sendgrids_expired_action_is_a_soft_bounce(return_path):
    """SendGrid's relay writes `Action: expired` (not one of RFC 3464's), often with an
    empty Status, for a message it gave up on: the block was skipped."""
    raw = bounce_mail("postfix_bounce.eml", verp=return_path.address(uuid.uuid4()),
                      message_id=MID)
    start = raw.index(b"Action: failed")
    end = raw.index(b"\r\n\r\n", start)
    raw = raw[:start] + b"Action: expired\r\nStatus: \r\nDiagnostic-Code: smtp; " \
        b"timed out after 72 hours" + raw[end:]
    (report,) = parse_mail(raw, return_path=return_path)
    assert (report.recipient, report.kind, report.status) == (ANN, "soft-bounced", "4.4.7")


@pytest.mark.parametrize(("name", "given", "said", "status"), [
    # Gmail's rate limit, under the code of a disabled account.
    ("gmail_bounce.eml", "Status: 5.1.1", "550-5.2.1 The user you are trying to contact is "
     "receiving mail at a rate that prevents additional messages from being delivered", "5.2.1"),
    # vpopmail's full mailbox, under the code of a mailbox that does not exist.
    ("postfix_bounce.eml", "Status: 5.1.1", "552 sorry, mailbox ann@example.com is over "
     "quota temporarily (#5.1.1)", "5.1.1"),
    # A domain whose name server answers nonsense: its DNS is broken, the domain not gone.
    ("aol_one_block.eml", "Status: 5.4.4", "Host or domain name not found. Name service "
     "error for name=example.com type=MX: Malformed or unexpected name server reply", "5.4.4"),
])
def test_a_failure_whose_reply_says_its_state_is_passing_is_soft(return_path, name, given, said,
                                                                 status):
    """A code of a dead or disabled address beside a reply that says the state is passing:
    the address was suppressed at once, and its mail stopped for good."""
    raw = bounce_mail(name, verp=return_path.address(uuid.uuid4()), message_id=MID)
    start = raw.index(b"Diagnostic-Code:")
    end = raw.index(b"\r\n\r\n", start)
    raw = raw[:start] + f"Diagnostic-Code: smtp; {said}".encode() + raw[end:]
    raw = raw.replace(given.encode(), f"Status: {status}".encode())
    (report,) = parse_mail(raw, return_path=return_path)
    assert (report.kind, report.status) == ("soft-bounced", status)


@pytest.mark.parametrize(("written", "instead"), [
    (b'boundary="3F2A1B2C3D.1764625201/mx.example.net"', b'boundary="another/mx.example.net"'),
    (b"\r\n--3F2A1B2C3D", b"\r\n --3F2A1B2C3D"),
], ids=["another boundary", "indented delimiters"])
def test_a_report_whose_parts_never_start_is_read_from_its_text(return_path, written, instead):
    """A report whose delimiter lines are not those of the boundary it declares is one
    text to email: nothing was read in it, and the hard bounce was `unparsed`. Its fields
    are read in the text, as WorkMail's are."""
    log_id = uuid.uuid4()
    raw = bounce_mail("postfix_bounce.eml", verp=return_path.address(log_id), message_id=MID)
    (report,) = parse_mail(raw.replace(written, instead), return_path=return_path)
    assert (report.kind, report.status, report.recipient) == ("bounced", "5.1.1", ANN)
    assert (report.log_id, report.message_id) == (log_id, MID)


def test_only_its_own_paragraph_says_whether_a_recipients_state_is_passing(return_path):
    """In a notice of two recipients, the second one's full mailbox follows the first one's
    refusal: it does not make the first, dead address a soft bounce."""
    raw = bounce_mail("qmail_two_recipients.eml", verp=return_path.address(uuid.uuid4()),
                      message_id=MID, other="bob@example.com").replace(
        b"552 5.2.2 <ann@example.com>: Recipient address rejected: Mailbox full",
        b"550 5.1.1 <ann@example.com>: Recipient address rejected: User unknown").replace(
        b"550 5.1.1 <bob@example.com>: Recipient address rejected: User unknown",
        b"552 5.1.1 sorry, mailbox bob@example.com is over quota temporarily")
    reports = {r.recipient: (r.kind, r.status) for r in parse_mail(raw,
                                                                   return_path=return_path)}
    assert reports == {ANN: ("bounced", "5.1.1"), "bob@example.com": ("soft-bounced", "5.1.1")}
