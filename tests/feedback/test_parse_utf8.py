"""The feedback parser on mail that carries UTF-8 as it is (RFC 6531/6533): raw UTF-8 in a
report's headers, and Postfix's real SMTPUTF8 bounce however it is wrapped."""

from __future__ import annotations

import uuid

import pytest

from postrelay.orchestrator.feedback.parse import parse_mail
from tests.feedback.conftest import MAIL, bounce_mail

MID = "<0b7c6a52-8f7e-4d1a-9a0b-2b1f3c4d5e6f@mail.acme.example>"


@pytest.mark.parametrize(("name", "header", "utf8", "kind"), [
    # Without its Auto-Submitted field, as many autoresponders send it: known by the Subject.
    ("out_of_office.eml", "Subject: Automatic reply: Welcome, Ann!\r\nDate",
     "Subject: Automatic reply: Willkommen, Jürgen!\r\nDate", "auto-reply"),
    ("qmail_two_recipients.eml", "From: MAILER-DAEMON@nq.example.jp",
     "From: Zustellsystem für nq <MAILER-DAEMON@nq.example.jp>", "soft-bounced"),
])
def test_raw_utf8_in_a_header_is_read_as_text(return_path, name, header, utf8, kind):
    """An SMTPUTF8 sender writes UTF-8 in headers as it is; email then handed such a value
    back as a Header object, and the classification (an out-of-office's Subject, flufl's
    detectors reading a bounce's From) failed on it: `unparsed`, unreadable."""
    raw = bounce_mail(name, verp=return_path.address(uuid.uuid4()), message_id=MID,
                      other="bob@example.com")
    assert header.encode() in raw
    raw = raw.replace(header.encode(), utf8.encode()).replace(b"Auto-Submitted: auto-replied\r\n",
                                                              b"")
    reports = parse_mail(raw, return_path=return_path)
    assert kind in {r.kind for r in reports} and "unparsed" not in {r.kind for r in reports}


REAL_UTF8 = MAIL / "real" / "postfix-3.7" / "smtputf8.eml"


@pytest.mark.parametrize("how", ["mixed", "forwarded"])
def test_an_rfc6533_report_is_read_whichever_way_it_is_wrapped(how):
    """email reads only message/delivery-status as blocks of fields; an RFC 6533
    message/global-delivery-status it reads as one message. A report the outline does not
    take (a DSN sent as multipart/mixed, one forwarded as an attachment) lost its recipient
    blocks: Postfix's real SMTPUTF8 bounce, so wrapped, was kept `unparsed`."""
    raw = REAL_UTF8.read_bytes()
    if how == "mixed":
        raw = raw.replace(b"multipart/report; report-type=delivery-status;", b"multipart/mixed;")
    else:
        raw = (b"From: postmaster@relay.example\r\nTo: fbl@bounces.example\r\n"
               b"Subject: Fwd: Undelivered Mail\r\nMessage-ID: <fwd1@relay.example>\r\n"
               b"MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"F\"\r\n\r\n"
               b"--F\r\nContent-Type: text/plain\r\n\r\nsee attached\r\n--F\r\n"
               b"Content-Type: message/rfc822\r\n\r\n" + raw + b"\r\n--F--\r\n")
    (as_sent,) = parse_mail(REAL_UTF8.read_bytes())
    (report,) = parse_mail(raw)
    assert (report.kind, report.recipient, report.status) == \
        (as_sent.kind, as_sent.recipient, as_sent.status) == ("bounced", as_sent.recipient,
                                                              "5.1.1")
    assert report.detail["format"] == "dsn"
