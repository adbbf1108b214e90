"""Bounces whose notice says less than a DSN, read for what it says and no more: a report
without a report-type or with its fields in the text, plain-text notices whose host
addresses or quoted originals hold dotted numbers or addresses, Exchange's text notice,
delay warnings, an address on a domain with a hyphen, mail from a mail system that no
reader understands; and what a permanent failure's code says of the recipient (the
reporting MTA's code against the remote's, codes that name no cause)."""

from __future__ import annotations

import uuid
from email.message import Message

import pytest

from postrelay.orchestrator.feedback import Feedback, SuppressionPolicy, record_many
from postrelay.orchestrator.feedback.model import suppresses
from postrelay.orchestrator.feedback.notice import body_text
from postrelay.orchestrator.feedback.parse import parse_mail
from tests.feedback.conftest import bounce_mail, insert_log, record

MID = "<job-7f3a@mail.acme.example>"


def reports(return_path, name: str, log_id: uuid.UUID | None = None,
            **values: str) -> list[Feedback]:
    raw = bounce_mail(name, verp=return_path.address(log_id or uuid.uuid4()), message_id=MID,
                      **values)
    return parse_mail(raw, return_path=return_path)


def test_a_report_without_a_report_type_is_read_by_its_parts(return_path):
    """Some MTAs leave the parameter out; the report was kept `unparsed` and the hard
    bounce it carries never suppressed the address."""
    log_id = uuid.uuid4()
    (report,) = reports(return_path, "report_without_type.eml", log_id)
    assert (report.kind, report.recipient, report.status, report.log_id) == \
        ("bounced", "ann@example.com", "5.1.1", log_id)


def test_a_read_receipt_is_still_not_a_bounce(return_path):
    raw = bounce_mail("report_without_type.eml", verp=return_path.address(uuid.uuid4()),
                      message_id=MID, recipient="ann@example.com").replace(
        b'multipart/report; boundary=',
        b'multipart/report; report-type=disposition-notification; boundary=')
    (report,) = parse_mail(raw, return_path=return_path)
    assert report.kind == "unparsed"
    assert "disposition-notification" in report.detail["reason"]


@pytest.mark.parametrize(("recipient", "reply", "kind", "status"), [
    # The remote host's address [10.5.1.1] was read as 5.1.1: a full mailbox suppressed
    # the address at once.
    ("ann@example.org", "552 5.2.2 mailbox full", "soft-bounced", "5.2.2"),
    # ... and a bounce whose reply has no code of its own took 5.1.1 from it: it has its
    # reply's class, which counts toward the soft-bounce limit.
    ("ann@example.org", "550 mailbox unavailable", "bounced", "5.0.0"),
    # A temporary reply the MTA gave up on is a soft bounce, not one that suppressed at
    # once for want of a code.
    ("ann@example.org", "452 mailbox full", "soft-bounced", "4.0.0"),
    ("ann@example.org", "retry timeout exceeded", "bounced", "5.0.0"),
    # flufl.bounce 6.0.0 dropped every failed address on a domain with a hyphen.
    ("ann@mail-example.org", "550 5.1.1 user unknown", "bounced", "5.1.1"),
])
def test_a_plain_text_bounce_is_read_by_its_reply_not_by_the_hosts_address(
        return_path, recipient, reply, kind, status):
    raw = bounce_mail("exim_plain_notice.eml", verp=return_path.address(uuid.uuid4()),
                      message_id=MID, recipient=recipient)
    (report,) = parse_mail(raw.replace(b"552 5.2.2 mailbox full", reply.encode()),
                           return_path=return_path)
    assert (report.kind, report.recipient, report.status) == (kind, recipient, status)


@pytest.mark.parametrize(("reply", "kind", "status"), [
    (b"550 5.7.1 IP address blacklisted", "bounced", "5.7.1"),
    (b"552 5.2.2 Over quota", "soft-bounced", "5.2.2"),
])
def test_a_failure_takes_the_remotes_own_code_over_the_reporting_mtas(return_path, reply,
                                                                       kind, status):
    """sendmail writes a Status of its own (5.1.1) beside the remote's reply: a blocklist
    refusal or a full mailbox suppressed a good address at once."""
    raw = bounce_mail("postfix_bounce.eml", verp=return_path.address(uuid.uuid4()),
                      message_id=MID, recipient="ann@example.com")
    raw = raw.replace(b"Diagnostic-Code: smtp; 550 5.1.1", b"Diagnostic-Code: smtp; " + reply)
    (report,) = parse_mail(raw, return_path=return_path)
    assert (report.kind, report.status) == (kind, status)


def test_codes_are_not_read_from_the_returned_message(return_path):
    """A qmail bounce with no code of its own took `Eudora Version 5.0.2` from the original
    it quotes: a 5.0.2 bounce, which neither suppressed nor counted, for a mailbox that does
    not exist. Its `550` makes it 5.0.0, which counts."""
    (report,) = reports(return_path, "qmail_quoting_versions.eml")
    assert (report.kind, report.recipient, report.status) == \
        ("bounced", "ann@example.com", "5.0.0")
    assert report.message_id == MID  # the original is still read for what ties it


def test_a_dsn_written_into_the_notice_is_read_as_a_dsn(return_path):
    """Amazon WorkMail writes the report's fields in its text ("Technical report:"), not
    in a delivery-status part: no reader knew it, and it was `unparsed`."""
    log_id = uuid.uuid4()
    (report,) = reports(return_path, "workmail_report_in_text.eml", log_id)
    assert (report.kind, report.recipient, report.status, report.log_id) == \
        ("bounced", "ann@example.com", "5.1.1", log_id)
    assert report.detail["format"] == "dsn"


def test_exchange_s_plain_text_notice_is_read(return_path):
    """Exchange Online's text-only notice ("Delivery has failed to these recipients or
    groups:") was known to no reader: `unparsed`, the dead address never suppressed."""
    (report,) = reports(return_path, "exchange_text_ndr.eml")
    assert (report.kind, report.recipient, report.status, report.message_id) == \
        ("bounced", "ann@example.com", "5.1.1", MID)


def test_only_the_addresses_the_notice_names_failed(return_path):
    """Zoho quotes the original's headers inline; the detector took its Message-ID and its
    sender for failed recipients too: three bounces for one."""
    (report,) = reports(return_path, "zoho_inline_original.eml")
    assert (report.kind, report.recipient, report.status) == \
        ("bounced", "ann@example.com", "5.1.1")


def test_a_returned_message_of_headers_alone_is_read_whatever_its_encoding():
    """A report's outline keeps the returned message's headers alone (no body at all); with
    a Content-Transfer-Encoding of quoted-printable, Python 3.11 fails to decode it
    (UnboundLocalError), and a bounce the detectors would have read was `unparsed`."""
    returned = Message()
    returned["Content-Transfer-Encoding"] = "quoted-printable"
    notice = Message()
    notice.set_payload("ann@example.com: 550 5.1.1 user unknown")
    report = Message()
    report.set_payload([notice, returned])
    report.set_type("multipart/report")
    assert body_text(report) == "ann@example.com: 550 5.1.1 user unknown\n"


def test_a_delay_warning_in_plain_text_is_a_delay(return_path):
    """Read as a soft bounce, a daily warning about one slow message counted toward the
    soft-bounce limit: three suppressed an address the MTA was still trying."""
    (report,) = reports(return_path, "gmail_delay_warning.eml")
    assert (report.kind, report.recipient) == ("delayed", "ann@example.com")


def test_mail_from_a_mail_system_that_nothing_reads_is_kept_for_an_operator(return_path):
    """Its Auto-Submitted made it an auto-reply, which is recorded and ignored: a bounce
    in a format no reader knows was out of an operator's sight."""
    (report,) = reports(return_path, "mailer_daemon_unknown.eml")
    assert report.kind == "unparsed"


def test_permanent_failures_that_name_no_cause_count_as_soft_bounces(engine, tenant, look):
    """`Status: 5.0.0` beside a bare `550 unknown user` (Postfix, Exim), sendmail's `553
    5.3.0 Addressee unknown`: each one suppressed nothing and counted for nothing, so an
    address that kept failing this way was mailed for good."""
    policy = SuppressionPolicy(soft_limit=3)
    with engine.begin() as conn:
        logs = [insert_log(conn, tenant_id=tenant) for _ in range(4)]
    bounces = [Feedback(kind="bounced", source="mail", recipient="ann@example.com",
                        status=status, source_event_id=f"u{i}", log_id=log["id"])
               for i, (log, status) in enumerate(zip(logs, ["5.0.0", "5.3.0", "5.7.0",
                                                           "5.5.0"], strict=True))]
    # The policy block (5.7.0) between them counts for nothing.
    assert [record(engine, b, policy).suppressed for b in bounces] == \
        [False, False, False, True]
    assert look.suppressed(tenant)[("ann@example.com", "")]["reason"].startswith(
        "bounced 5.5.0")


def test_yahoos_bounce_of_a_mailbox_that_does_not_exist_suppresses_at_once(
        return_path, engine, tenant, look):
    """Yahoo's `554 delivery error: dd This user doesn't have a yahoo.com account` has no
    enhanced code (its bounce's status is the class, 5.0.0): the address counted toward
    the soft-bounce limit, and a transactional recipient mailed less than three times a
    week was mailed for good."""
    with engine.begin() as conn:
        log = insert_log(conn, tenant_id=tenant, message_id=MID)
    (report,) = reports(return_path, "yahoo_bounce.eml", log["id"])
    assert (report.kind, report.status) == ("bounced", "5.0.0")
    assert record(engine, report).suppressed
    assert "This user doesn't have a yahoo.com account" in \
        look.suppressed(tenant)[("ann@example.com", "")]["reason"]


@pytest.mark.parametrize(("status", "diagnostic", "suppressed"), [
    ("5.0.0", "smtp; 550 User unknown", True),
    ("5.5.0", "smtp; 550 5.5.0 Requested action not taken: mailbox unavailable "
              "(S2017062302)", True),  # Outlook.com
    ("5.0.0", "smtp; 550 Recipient does not exist on this system", True),
    ("5.3.0", "SMTP; 553 5.3.0 <ann@example.com>... Addressee unknown", True),  # sendmail
    # Yahoo's answers since 2020: a mailbox that is not there, one that is disabled.
    ("5.0.0", "smtp; 552 1 Requested mail action aborted, mailbox not found", True),
    ("5.0.0", "smtp; 554 30 Sorry, your message to ann@example.com cannot be delivered. "
              "This mailbox is disabled (554.30)", True),
    ("5.0.0", 'ann@example.com: unrouteable mail domain "example.com"', True),  # Exim
    # About the sender (a refused envelope sender), a policy, the message (a reply to
    # DATA), a passing state; a specific code that says otherwise; no words of the kind.
    ("5.1.0", "smtp; 550 5.1.0 <bob@acme.example>: Sender address rejected: User unknown "
              "in local recipient table", False),
    ("5.0.0", "smtp; 550 Requested action not taken: mailbox unavailable (blocked by "
              "policy)", False),
    ("5.0.0", "X-Postfix; host mx.example.com said: 553 acme.example does not exist (in "
              "reply to end of DATA command)", False),
    ("5.0.0", "smtp; 552 Requested action not taken: mailbox unavailable, over quota",
     False),
    ("5.7.1", "smtp; 550 5.7.1 User unknown", False),
    ("5.0.0", "smtp; 550 Message refused", False),
])
def test_a_failure_whose_code_names_no_cause_suppresses_by_its_words(
        engine, tenant, look, status, diagnostic, suppressed):
    with engine.begin() as conn:
        log = insert_log(conn, tenant_id=tenant)
    report = Feedback(kind="bounced", source="mail", recipient="ann@example.com",
                      status=status, diagnostic=diagnostic, source_event_id="w1",
                      log_id=log["id"])
    assert record(engine, report).suppressed is suppressed
    assert (("ann@example.com", "") in look.suppressed(tenant)) is suppressed


def test_a_plain_text_notice_gives_each_recipient_the_words_of_its_own_paragraph(
        return_path):
    """Each recipient's diagnostic was the 300 characters from its address on: the next
    recipient's `User unknown` (or the returned message after the last one) was read as
    its own words."""
    raw = bounce_mail("qmail_two_recipients.eml", verp=return_path.address(uuid.uuid4()),
                      message_id=MID).replace(
        b"552 5.2.2 <ann@example.com>: Recipient address rejected: Mailbox full",
        b"550 Message refused").replace(
        b"550 5.1.1 <bob@example.com>: Recipient address rejected: User unknown",
        b"550 <bob@example.com>: User unknown")
    ann, bob = sorted(parse_mail(raw, return_path=return_path), key=lambda r: r.recipient)
    assert (ann.status, bob.status) == ("5.0.0", "5.0.0")
    assert "User unknown" not in ann.diagnostic and "Below this line" not in bob.diagnostic
    assert not suppresses(ann.kind, ann.status, ann.diagnostic)
    assert suppresses(bob.kind, bob.status, bob.diagnostic)


def test_a_batchs_unspecific_failures_count_toward_its_soft_bounces(engine, tenant, look):
    policy = SuppressionPolicy(soft_limit=3)
    with engine.begin() as conn:
        logs = [insert_log(conn, tenant_id=tenant) for _ in range(3)]
        done = record_many(conn, [
            Feedback(kind="bounced", source="mail", recipient="ann@example.com", status=status,
                     source_event_id=f"b{i}", log_id=log["id"])
            for i, (log, status) in enumerate(zip(logs, ["5.0.0", "5.3.0", "5.0.0"],
                                                  strict=True))], policy)
    assert [d.suppressed for d in done] == [False, False, True]
