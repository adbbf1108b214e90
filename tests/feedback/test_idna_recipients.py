"""Feedback that names a recipient on an internationalized domain in Unicode (an RFC 6533
report, a provider's event) is about the address postrelay sent to: the log keeps a
recipient's domain in its IDNA form (parse_address), as the message went out with it."""

from __future__ import annotations

from postrelay.orchestrator import ses_reports
from postrelay.orchestrator.admin import email_list, suppression_list, suppression_remove
from postrelay.orchestrator.feedback import Feedback
from postrelay.orchestrator.feedback.parse import parse_mail
from tests.feedback.conftest import insert_log, record

SENT_TO = "ann@xn--bcher-kva.example"  # what the log holds of Ann@Bücher.example


def test_a_bounce_naming_the_unicode_domain_suppresses_the_address_sent_to(engine, tenant, look):
    """A hard bounce that names Ann@Bücher.example: the address the message was sent to,
    so it suppresses it (it was kept as a recipient the message never had)."""
    with engine.begin() as conn:
        by_verp = insert_log(conn, tenant_id=tenant, recipients=(SENT_TO,))
        by_queue = insert_log(conn, tenant_id=tenant, recipients=(SENT_TO,), queue_id="Q-IDN")
    done = record(
        engine,
        Feedback(
            kind="bounced",
            source="mail",
            recipient="Ann@Bücher.example",
            status="5.1.1",
            source_event_id="idn-1",
            log_id=by_verp["id"],
        ),
    )
    assert done.suppressed and done.email_log_id == by_verp["id"]
    queued = record(
        engine,
        Feedback(
            kind="bounced",
            source="mail",
            recipient="ann@BÜCHER.example",
            status="5.1.1",
            source_event_id="idn-2",
            queue_id="Q-IDN",
        ),
    )
    assert queued.email_log_id == by_queue["id"]
    assert set(look.suppressed(tenant)) == {(SENT_TO, "")}
    assert {r["recipient"] for r in look.feedback()} == {SENT_TO}


def test_a_provider_event_naming_the_unicode_domain_matches_its_message(engine, tenant, look):
    with engine.begin() as conn:
        log = insert_log(conn, tenant_id=tenant, recipients=(SENT_TO,))
    note = {
        "notificationType": "Complaint",
        "mail": {
            "messageId": "ses-idn",
            "headers": [{"name": "Message-ID", "value": log["message_id"]}],
        },
        "complaint": {
            "feedbackId": "fb-idn",
            "complainedRecipients": [{"emailAddress": "ann@bücher.example"}],
        },
    }
    (report,), _ = ses_reports(note, "sns-idn")
    done = record(engine, report)
    assert done.email_log_id == log["id"] and done.suppressed
    assert look.log(log["id"])["delivery"] == "complained"


def test_an_rfc6533_utf8_address_in_its_ascii_form_is_read():
    """RFC 6533 3: a `utf-8` address in a message/delivery-status part writes each
    non-ASCII character as `\\x{HEX}`."""
    raw = (
        b"From: MAILER-DAEMON@mx.example\r\nTo: bounces@bounces.acme.example\r\n"
        b"Subject: Undelivered Mail\r\nMessage-ID: <dsn-idn@mx.example>\r\n"
        b"MIME-Version: 1.0\r\nContent-Type: multipart/report; "
        b'report-type=delivery-status; boundary="B"\r\n\r\n'
        b"--B\r\nContent-Type: text/plain\r\n\r\nundeliverable\r\n"
        b"--B\r\nContent-Type: message/delivery-status\r\n\r\n"
        b"Reporting-MTA: dns; mx.example\r\n\r\n"
        b"Final-Recipient: utf-8; ann@b\\x{FC}cher.example\r\n"
        b"Action: failed\r\nStatus: 5.1.1\r\n\r\n--B--\r\n"
    )
    (report,) = parse_mail(raw)
    assert (report.kind, report.recipient, report.status) == ("bounced", SENT_TO, "5.1.1")


def test_an_operator_finds_and_lifts_the_suppression_by_the_unicode_domain(engine, tenant,
                                                                           look):
    """`emails suppressed --address` and `emails unsuppress` take the address as an
    operator spells it: the suppression is kept in the IDNA form it was sent to."""
    with engine.begin() as conn:
        log = insert_log(conn, tenant_id=tenant, recipients=(SENT_TO,))
    record(engine, Feedback(kind="bounced", source="mail", recipient=SENT_TO, status="5.1.1",
                            source_event_id="idn-op", log_id=log["id"]))
    with engine.begin() as conn:
        shown = suppression_list(conn, address="Ann@Bücher.example")
        assert [row["address"] for row in shown] == [SENT_TO]
        assert [row["recipients"] for row in email_list(conn, recipient="ann@bücher.example")
                ] == [[SENT_TO]]
        assert suppression_remove(conn, "Ann@Bücher.example", tenant_id=tenant,
                                  actor="cli:test") == []
    assert look.suppressed(tenant) == {}
