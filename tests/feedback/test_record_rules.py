"""Suppression rules and rates at their edges, on a real PostgreSQL: 5.7.x policy blocks that
providers report as soft bounces, unsubscribes about transactional mail, complaints whose
recipient a feedback loop redacted, and feedback that resolves an `unknown` row of an hour
the email hour tally has counted."""

from __future__ import annotations

import asyncio
import string
import uuid

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.orchestrator import (
    EmailHourTally,
    feedback_rates,
    postmark_reports,
    sendgrid_reports,
    ses_reports,
)
from postrelay.orchestrator.email_hours import EMAIL_HOURS
from postrelay.orchestrator.feedback import (
    Feedback,
    SuppressionPolicy,
    record_feedback,
    record_many,
)
from postrelay.orchestrator.feedback.parse import parse_mail
from tests.feedback.conftest import BOUNCE_DOMAIN, insert_log, record
from tests.integration.worker_helpers import wait_until, waiting_on_a_lock

ANN = "ann@example.com"


def ses_transient(log, i):
    """Amazon SES's Transient bounce of a 5.7.1 policy block."""
    note = {"notificationType": "Bounce",
            "mail": {"messageId": f"ses-{i}", "headers": [
                {"name": "Message-ID", "value": log["message_id"]}]},
            "bounce": {"bounceType": "Transient", "bounceSubType": "General",
                       "feedbackId": f"fb-{i}", "bouncedRecipients": [
                           {"emailAddress": ANN, "status": "5.7.1", "diagnosticCode":
                            "smtp; 554 5.7.1 Message rejected due to local policy"}]}}
    (report,), _ = ses_reports(note, f"sns-{i}")
    return report


def postmark_soft(queue_id, i):
    """Postmark's SoftBounce of a 5.7.1 block (matched by its MessageID, the queue id)."""
    (report,), _ = postmark_reports({
        "RecordType": "Bounce", "Type": "SoftBounce", "TypeCode": 4096, "ID": i,
        "MessageID": queue_id, "Email": ANN, "BouncedAt": "2024-05-01T10:00:00Z",
        "Details": "smtp;550 5.7.1 Service unavailable; client host blocked"})
    return report


def soft(log, i, status="4.2.2"):
    return Feedback(kind="soft-bounced", source="mail", recipient=ANN, status=status,
                    source_event_id=f"s{i}", log_id=log["id"])


# 5.7.x policy blocks reported as soft bounces

def test_policy_blocks_reported_as_soft_bounces_neither_suppress_nor_count(engine, tenant,
                                                                           look):
    policy = SuppressionPolicy(soft_limit=2)
    with engine.begin() as conn:
        logs = [insert_log(conn, tenant_id=tenant, queue_id=f"q{i}") for i in range(6)]
    blocks = [ses_transient(logs[0], 0), ses_transient(logs[1], 1), postmark_soft("q2", 2)]
    assert [(b.kind, b.status) for b in blocks] == [("soft-bounced", "5.7.1")] * 3
    assert [record(engine, b, policy).suppressed for b in blocks] == [False] * 3
    assert look.suppressed(tenant) == {}
    # The blocks recorded before are not counted: the first real soft bounce is the first.
    assert record(engine, soft(logs[3], 3), policy).suppressed is False
    assert record(engine, soft(logs[4], 4), policy).suppressed is True
    assert look.suppressed(tenant)[(ANN, "")]["reason"].startswith("soft-bounced 4.2.2")
    # Each block still marks its message soft-bounced and emits its event.
    assert look.log(logs[0]["id"])["delivery"] == "soft-bounced"
    assert [e["event_type"] for e in look.events()] == ["email.bounced"] * 5


def test_a_batchs_policy_blocks_do_not_count_toward_its_soft_bounces(engine, tenant, look):
    policy = SuppressionPolicy(soft_limit=2)
    with engine.begin() as conn:
        logs = [insert_log(conn, tenant_id=tenant) for _ in range(3)]
        done = record_many(conn, [soft(logs[0], 0, "5.7.1"), soft(logs[1], 1, "5.7.26"),
                                  soft(logs[2], 2)], policy)
    assert [d.suppressed for d in done] == [False, False, False]
    assert look.suppressed(tenant) == {}


@pytest.mark.parametrize(("status", "at_once", "counts"), [
    ("5.1.8", False, False),  # the sender's domain: a refusal of ours, not the recipient's
    ("5.1.7", False, False),
    ("5.1.0", False, True),  # an address, unsaid whose (SES's "Unknown address error")
    ("5.4.1", False, True),  # Exchange Online: "Recipient address rejected: Access denied"
    ("5.7.13", True, False),  # "User Account Disabled": the one 5.7.x about the address
])
def test_what_a_permanent_failures_code_says_of_the_recipient(engine, tenant, look, status,
                                                              at_once, counts):
    policy = SuppressionPolicy(soft_limit=2)
    with engine.begin() as conn:
        logs = [insert_log(conn, tenant_id=tenant) for _ in range(2)]
    bounced = [Feedback(kind="bounced", source="mail", recipient=ANN, status=status,
                        source_event_id=f"p{i}", log_id=log["id"])
               for i, log in enumerate(logs)]
    assert record(engine, bounced[0], policy).suppressed is at_once
    assert record(engine, bounced[1], policy).suppressed is (counts and not at_once)
    assert bool(look.suppressed(tenant)) is (at_once or counts)


def test_soft_bounces_about_messages_whose_log_rows_are_gone_still_count(engine, tenant):
    """With POSTRELAY_EMAIL_LOG_RETENTION_DAYS shorter than the soft-bounce window, the
    count checked each earlier bounce against a log row retention had deleted: none
    counted, and the address was never suppressed."""
    policy = SuppressionPolicy(soft_limit=3)
    with engine.begin() as conn:
        logs = [insert_log(conn, tenant_id=tenant) for _ in range(3)]
    assert [record(engine, soft(log, i), policy).suppressed
            for i, log in enumerate(logs[:2])] == [False, False]
    with engine.begin() as conn:  # as email log retention deletes them
        conn.execute(text("DELETE FROM mdm.aa_email_log WHERE id = ANY(:ids)"),
                     {"ids": [log["id"] for log in logs[:2]]})
    assert record(engine, soft(logs[2], 2), policy).suppressed is True


def test_soft_bounces_about_messages_never_sent_to_the_address_do_not_count(engine, tenant):
    """What the row keeps is what the count needs: forged bounces still do not add up."""
    policy = SuppressionPolicy(soft_limit=2)
    with engine.begin() as conn:
        other = insert_log(conn, tenant_id=tenant, recipients=["bob@example.com"])
        mine = insert_log(conn, tenant_id=tenant)
    forged = Feedback(kind="soft-bounced", source="mail", recipient=ANN, status="4.2.2",
                      source_event_id="forged", message_id=other["message_id"])
    assert record(engine, forged, policy).suppressed is False
    assert record(engine, soft(mine, 1), policy).suppressed is False


# Unsubscribes about transactional mail

def test_an_unsubscribe_about_transactional_mail_is_recorded_and_suppresses_nothing(
        engine, tenant, look):
    with engine.begin() as conn:
        receipt = insert_log(conn, tenant_id=tenant, queue_id="pm-1")  # no category
        reset = insert_log(conn, tenant_id=tenant, recipients=("bob@example.com",))
        news = insert_log(conn, tenant_id=tenant, recipients=("cy@example.com",),
                          category="news", queue_id="pm-2")
    changes = [{"RecordType": "SubscriptionChange", "MessageID": q, "Recipient": to,
                "ChangedAt": "2024-05-01T10:00:00Z", "SuppressSending": True,
                "SuppressionReason": "ManualSuppression", "Origin": "Recipient"}
               for q, to in (("pm-1", ANN), ("pm-2", "cy@example.com"))]
    reports = [r for c in changes for r in postmark_reports(c)[0]] + sendgrid_reports(
        [{"email": "bob@example.com", "event": "unsubscribe", "sg_event_id": "u-1",
          "smtp-id": reset["message_id"], "timestamp": 1700000000}])[0]
    with engine.begin() as conn:
        done = record_many(conn, reports)
    assert [(d.suppressed, d.event_type) for d in done] == [
        (False, "email.unsubscribed"), (True, "email.unsubscribed"),
        (False, "email.unsubscribed")]
    # Only the bulk message's category is suppressed; nothing stops all of Ann's or Bob's mail.
    assert set(look.suppressed(tenant)) == {("cy@example.com", "news")}
    rows = {r["recipient"]: r for r in look.feedback()}
    assert rows[ANN]["email_log_id"] == receipt["id"] and not rows[ANN]["suppressed"]
    for who in (ANN, "bob@example.com"):
        assert rows[who]["detail"]["no_category"].startswith("transactional mail")
    assert "no_category" not in rows["cy@example.com"]["detail"]
    events = {e["payload"]["recipient"]: e["payload"] for e in look.events()}
    assert events[ANN]["suppressed"] is False and events[ANN]["category"] is None
    assert events["cy@example.com"]["category"] == "news"
    assert look.log(news["id"])["delivery"] is None


# Complaints whose recipient a feedback loop redacted (RFC 6590)

REDACTED = "5d41402abc4b2a76b9719d911017c592@comcast.net"

VALIDITY_ARF = """\
Return-Path: <fbl@bounce.mailstream.senderscore.net>
Date: Tue, 1 Dec 2026 22:10:01 +0000
Mime-Version: 1.0
Content-Type: multipart/report; report-type=feedback-report; boundary=b1
Message-Id: <01c9e2a7.fbl@bounce.mailstream.senderscore.net>
To: fbl@$domain
Subject: Comcast Abuse Report
From: Comcast FBL Service <feedbackloop@comcastfbl.senderscore.net>

--b1
Content-Type: text/plain; charset=UTF-8

This is a Comcast Abuse Report for an email message received from domain acme.example.

--b1
Content-Type: message/feedback-report

Source-Ip: 198.51.100.7
User-Agent: ReturnPathFBL/2.0
Original-Rcpt-To: $redacted
Reported-Domain: acme.example
Original-Mail-From: $verp
Feedback-Type: abuse
Version: 1
Arrival-Date: Tue, 1 Dec 2026 21:40:00 +0000

--b1
Content-Type: message/rfc822

Return-Path: <$verp>
Message-ID: $mid
From: Acme <noreply@acme.example>
To: $redacted
Subject: Welcome, Ann!

Hello Ann, welcome aboard.

--b1--
"""


def test_a_complaint_with_a_redacted_recipient_suppresses_the_messages_only_one(
        engine, tenant, look, return_path):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, recipients=("ann@comcast.net",))
    raw = string.Template(VALIDITY_ARF).substitute(
        domain=BOUNCE_DOMAIN, verp=return_path.address(sent["id"]),
        mid=sent["message_id"], redacted=REDACTED).replace("\n", "\r\n").encode()
    (report,) = parse_mail(raw, return_path=return_path)
    assert (report.kind, report.recipient) == ("complaint", REDACTED)
    done = record(engine, report)
    assert (done.matched_by, done.suppressed, done.event_type) == (
        "verp", True, "email.complained")
    (row,) = look.feedback()
    assert (row["email_log_id"], row["recipient"]) == (sent["id"], "ann@comcast.net")
    assert row["detail"]["redacted_recipient"] == REDACTED
    assert set(look.suppressed(tenant)) == {("ann@comcast.net", "")}
    assert look.log(sent["id"])["delivery"] == "complained"
    assert look.events()[0]["payload"]["recipient"] == "ann@comcast.net"


def test_a_named_recipient_is_taken_for_the_only_one_on_its_domain_in_complaints_only(
        engine, tenant, look):
    with engine.begin() as conn:
        one = insert_log(conn, tenant_id=tenant, recipients=("ann@comcast.net",))
        two = insert_log(conn, tenant_id=tenant,
                         recipients=("ann@comcast.net", "bob@comcast.net"))
        elsewhere = insert_log(conn, tenant_id=tenant, recipients=("ann@example.net",))

    def report(kind, log, i, recipient="5D41402ABC@Comcast.NET"):
        return record(engine, Feedback(kind=kind, source="mail", recipient=recipient,
                                       status="5.1.1" if kind == "bounced" else None,
                                       source_event_id=f"r{i}",
                                       message_id=log["message_id"]))

    # The domain is compared whatever its case.
    assert report("complaint", one, 0).suppressed is True
    # Which of two recipients complained cannot be told; a bounce names its address.
    assert [report("complaint", two, 1).matched_by, report("bounced", one, 2).matched_by,
            report("complaint", elsewhere, 3).matched_by] == [None, None, None]
    assert set(look.suppressed(tenant)) == {("ann@comcast.net", "")}
    assert look.feedback()[0]["detail"]["redacted_recipient"] == "5d41402abc@comcast.net"


# Rates of rows resolved after their hour was tallied

async def tally_all(async_engine: AsyncEngine) -> None:
    tally = EmailHourTally(async_engine)
    while (await tally.run_once()).hours:
        pass


def hour_rows(engine: Engine, tenant: uuid.UUID) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(text(
            "SELECT status, sum(messages) FROM mdm.aa_email_hour WHERE tenant_id = :t"
            " GROUP BY status"), {"t": tenant}).all())


def two_hours_ago(engine: Engine, *logs) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_email_log SET created_at = now() - interval '2h'"
                          " WHERE id = ANY(:ids)"), {"ids": [log["id"] for log in logs]})


def rates_24h(engine: Engine, tenant: uuid.UUID) -> tuple[int, int, float]:
    with engine.connect() as conn:
        (row,) = feedback_rates(conn, tenant_id=tenant)
    return row["messages_24h"], row["bounced_24h"], row["bounce_rate_24h"]


def bounce(log, i):
    return Feedback(kind="bounced", source="mail", recipient=f"u{i}@example.com",
                    status="5.1.1", source_event_id=f"b{i}", log_id=log["id"])


async def test_feedback_that_resolves_unknown_rows_of_a_tallied_hour_moves_them_to_sent(
        engine, async_engine, tenant, look):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, recipients=("ok@example.com",))
        unknown = [insert_log(conn, tenant_id=tenant, recipients=(f"u{i}@example.com",),
                              status="unknown") for i in range(3)]
    two_hours_ago(engine, sent, *unknown)
    await tally_all(async_engine)
    assert hour_rows(engine, tenant) == {"sent": 1, "unknown": 3}
    with engine.begin() as conn:
        done = record_many(conn, [bounce(log, i) for i, log in enumerate(unknown[:2])])
    assert all(d.resolved_unknown and d.suppressed for d in done)
    # The same messages above and below the line: two of three bounced, not two of one.
    assert rates_24h(engine, tenant) == (3, 2, 2 / 3)
    assert hour_rows(engine, tenant) == {"sent": 3, "unknown": 1}
    # A report about a row resolved before moves nothing again.
    record(engine, Feedback(kind="complaint", source="mail", recipient="u0@example.com",
                            source_event_id="c0", log_id=unknown[0]["id"]))
    assert hour_rows(engine, tenant) == {"sent": 3, "unknown": 1}


async def test_a_tally_round_and_feedback_resolving_a_row_of_its_hour_count_it_once(
        engine, async_engine, tenant):
    """Whichever takes the tally's mark first, a resolved row is counted `sent` once: a
    round waits for the feedback that resolved a row and then counts it `sent`; feedback
    waits for a round that counted it `unknown` and then moves the count."""
    with engine.begin() as conn:
        unknown = [insert_log(conn, tenant_id=tenant, recipients=(f"u{i}@example.com",),
                              status="unknown") for i in range(2)]
    two_hours_ago(engine, *unknown)

    def mark_before_their_hour() -> None:
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO mdm.aa_email_hour_rollup (id, until) VALUES (true, "
                "date_trunc('hour', now() - interval '2h', 'UTC')) ON CONFLICT (id) DO "
                "UPDATE SET until = EXCLUDED.until"))

    async def until_waiting() -> None:  # on the mark's row (the only lock taken here)
        await wait_until(lambda: asyncio.to_thread(waiting_on_a_lock, engine, 1, ""))

    # Feedback first: the round waits for its commit, then counts the row `sent`.
    mark_before_their_hour()
    with engine.connect() as conn:
        record_feedback(conn, bounce(unknown[1], 1))
        round_done = asyncio.create_task(EmailHourTally(async_engine).run_once())
        try:
            await until_waiting()
        finally:
            conn.commit()
            await round_done
    assert hour_rows(engine, tenant) == {"sent": 1, "unknown": 1}

    # The round first (the hour tallied again): it counted the other row `unknown` and
    # holds the mark; the feedback waits, then moves what the round wrote.
    mark_before_their_hour()
    with engine.connect() as round_:
        mark = round_.execute(EMAIL_HOURS.mark, {"now": None, "margin_secs": 0.0}).one()
        round_.execute(EMAIL_HOURS.tally, {"start": mark.until, "end": mark.cutoff,
                                           **EMAIL_HOURS.params})
        resolving = asyncio.create_task(asyncio.to_thread(record, engine,
                                                          bounce(unknown[0], 0)))
        try:
            await until_waiting()
        finally:
            round_.commit()
            await resolving
    assert hour_rows(engine, tenant) == {"sent": 2, "unknown": 0}
    assert rates_24h(engine, tenant) == (2, 2, 1.0)
