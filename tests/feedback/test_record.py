"""record_feedback on a real PostgreSQL: matching, the feedback row, the log row's delivery
outcome, the suppression rules, the outbox events, held jobs and idempotency."""

from __future__ import annotations

from sqlalchemy import text

from postrelay.orchestrator import email_story
from postrelay.orchestrator.feedback import (
    Feedback,
    SuppressionPolicy,
    record_many,
)
from postrelay.orchestrator.feedback.parse import parse_mail
from tests.factories import insert_job
from tests.feedback.conftest import bounce_mail, insert_log, record

ANN = "ann@example.com"


def test_a_hard_bounce_by_verp_token_bounces_the_row_suppresses_and_emits(engine, tenant, look):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    done = record(engine, Feedback(kind="bounced", source="mail", recipient="Ann@Example.com",
                                   status="5.1.1", diagnostic="smtp; 550 5.1.1 no such user",
                                   source_event_id="<dsn-1@mx.example.net>",
                                   log_id=sent["id"]))
    assert (done.matched_by, done.suppressed, done.event_type) == ("verp", True, "email.bounced")
    (row,) = look.feedback()
    assert (row["tenant_id"], row["email_log_id"], row["recipient"], row["kind"],
            row["status"], row["suppressed"]) == (tenant, sent["id"], ANN, "bounced", "5.1.1",
                                                  True)
    log = look.log(sent["id"])
    assert (log["status"], log["delivery"]) == ("sent", "bounced")
    assert log["delivery_at"] is not None
    suppression = look.suppressed(tenant)[(ANN, "")]
    assert suppression["source"] == "mail" and suppression["feedback_id"] == row["id"]
    assert "5.1.1" in suppression["reason"] and "no such user" in suppression["reason"]
    (event,) = look.events()
    assert (event["event_type"], event["aggregate_type"], event["aggregate_id"],
            event["tenant_id"]) == ("email.bounced", "email", str(sent["id"]), tenant)
    assert event["payload"]["recipient"] == ANN and event["payload"]["permanent"] is True
    assert event["payload"]["feedback_id"] == str(row["id"])


def test_the_same_feedback_twice_changes_nothing_the_second_time(engine, tenant, look):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    feedback = Feedback(kind="complaint", source="mail", recipient=ANN,
                        source_event_id="<arf-1@fbl.example>", message_id=sent["message_id"])
    first = record(engine, feedback)
    again = record(engine, feedback)
    assert not first.duplicate and again.duplicate and again.feedback_id is None
    assert len(look.feedback()) == 1 and len(look.events()) == 1
    assert look.log(sent["id"])["delivery"] == "complained"


def test_a_forged_bounce_for_a_message_never_sent_is_kept_unmatched_and_suppresses_nothing(
        engine, tenant, look):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, recipients=(ANN,))
    forged = record(engine, Feedback(kind="bounced", source="mail", recipient=ANN,
                                     status="5.1.1", source_event_id="x1",
                                     message_id="<nothing-we-sent@acme.example>"))
    # A real Message-ID, but a recipient that message never had.
    other = record(engine, Feedback(kind="bounced", source="mail", recipient="bob@example.com",
                                    status="5.1.1", source_event_id="x2",
                                    message_id=sent["message_id"]))
    assert forged.matched_by is None and not forged.suppressed and forged.event_type is None
    assert other.matched_by is None and not other.suppressed
    assert other.event_type is None
    rows = look.feedback()
    assert [r["tenant_id"] for r in rows] == [None, tenant]
    assert [r["email_log_id"] for r in rows] == [None, None]
    assert rows[1]["detail"]["claimed_log_id"] == str(sent["id"])
    assert look.suppressed(tenant) == {} and look.events() == []
    assert look.log(sent["id"])["delivery"] is None


def test_a_policy_block_bounces_the_row_but_never_suppresses(engine, tenant, look):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    done = record(engine, Feedback(kind="bounced", source="mail", recipient=ANN, status="5.7.1",
                                   source_event_id="p1", log_id=sent["id"]))
    assert not done.suppressed and done.event_type == "email.bounced"
    assert look.log(sent["id"])["delivery"] == "bounced"
    assert look.suppressed(tenant) == {}


def test_soft_bounces_suppress_only_at_the_count_within_the_window(engine, tenant, look):
    policy = SuppressionPolicy(soft_limit=3, soft_window_secs=3600)
    with engine.begin() as conn:
        logs = [insert_log(conn, tenant_id=tenant) for _ in range(3)]
    results = [record(engine, Feedback(kind="soft-bounced", source="mail", recipient=ANN,
                                       status="4.2.2", source_event_id=f"s{i}",
                                       log_id=log["id"]), policy)
               for i, log in enumerate(logs)]
    assert [r.suppressed for r in results] == [False, False, True]
    assert look.suppressed(tenant)[(ANN, "")]["reason"].startswith("soft-bounced 4.2.2")
    # Outside the window, the earlier ones no longer count.
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM mdm.aa_email_suppression"))
        conn.execute(text("UPDATE mdm.aa_email_feedback SET received_at = now() - interval '2h'"))
        later = insert_log(conn, tenant_id=tenant)
    assert not record(engine, Feedback(kind="soft-bounced", source="mail", recipient=ANN,
                                       status="4.2.2", source_event_id="s9",
                                       log_id=later["id"]), policy).suppressed


def test_a_lift_starts_the_soft_bounce_count_afresh(engine, tenant, look):
    """The mailbox was full, its owner cleared it and asked to get mail again: the soft
    bounces from before the lift no longer count, so one more does not suppress at once."""
    from postrelay.orchestrator import suppression_remove

    policy = SuppressionPolicy(soft_limit=2, soft_window_secs=3600)
    with engine.begin() as conn:
        logs = [insert_log(conn, tenant_id=tenant) for _ in range(4)]

    def soft(i):
        return record(engine, Feedback(kind="soft-bounced", source="mail", recipient=ANN,
                                       status="4.2.2", source_event_id=f"s{i}",
                                       log_id=logs[i]["id"]), policy).suppressed

    assert soft(0) is False
    # Lifting an unsubscribe from one category (it subscribed again) is another matter.
    record(engine, Feedback(kind="unsubscribe", source="one-click", recipient=ANN,
                            tenant_id=tenant, category="news", vouched=True,
                            source_event_id="u1"))
    with engine.begin() as conn:
        suppression_remove(conn, ANN, tenant_id=tenant, actor="preferences", category="news")
    assert soft(1) is True
    with engine.begin() as conn:
        suppression_remove(conn, ANN, tenant_id=tenant, actor="support")
    assert [soft(2), soft(3)] == [False, True]
    assert set(look.suppressed(tenant)) == {(ANN, "")}


def test_forged_soft_bounces_do_not_add_up(engine, tenant, look):
    policy = SuppressionPolicy(soft_limit=2)
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, recipients=("bob@example.com",))
    for i in range(3):  # a real Message-ID, another recipient
        record(engine, Feedback(kind="soft-bounced", source="mail", recipient=ANN,
                                status="4.2.2", source_event_id=f"f{i}",
                                message_id=sent["message_id"]), policy)
    assert look.suppressed(tenant) == {}


def test_a_complaint_that_withholds_the_recipient_names_the_only_one(engine, tenant, look):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    done = record(engine, Feedback(kind="complaint", source="mail", source_event_id="c1",
                                   message_id=sent["message_id"].strip("<>")))
    assert done.suppressed and done.event_type == "email.complained"
    assert look.feedback()[0]["recipient"] == ANN


def test_the_relays_queue_id_matches_the_latest_row_sent_to_the_recipient(engine, tenant, look):
    with engine.begin() as conn:
        insert_log(conn, tenant_id=tenant, queue_id="4F3A2B", recipients=("bob@example.com",))
        sent = insert_log(conn, tenant_id=tenant, queue_id="4F3A2B")
    done = record(engine, Feedback(kind="delivered", source="mail", recipient=ANN,
                                   source_event_id="d1", queue_id="4F3A2B"))
    assert (done.matched_by, done.email_log_id, done.event_type) == (
        "queue_id", sent["id"], "email.delivered")
    assert look.log(sent["id"])["delivery"] == "delivered"


def test_a_later_delay_report_does_not_undo_a_bounce(engine, tenant, look):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    for i, kind in enumerate(("delayed", "bounced", "delayed", "delivered")):
        record(engine, Feedback(kind=kind, source="mail", recipient=ANN, status=None,
                                source_event_id=f"r{i}", log_id=sent["id"]))
    assert look.log(sent["id"])["delivery"] == "bounced"
    assert [e["event_type"] for e in look.events()] == ["email.bounced", "email.delivered"]


def test_an_unknown_row_is_resolved_and_its_held_job_completed_without_a_send(
        engine, tenant, look):
    with engine.begin() as conn:
        job = insert_job(conn, tenant_id=tenant, kind="email_send", status="dlq",
                         attempts=2, last_error="the outcome of the previous attempt is unknown")
        held = insert_log(conn, tenant_id=tenant, job_id=job, status="unknown")
    done = record(engine, Feedback(kind="delivered", source="mail", recipient=ANN,
                                   source_event_id="d1", message_id=held["message_id"]))
    assert done.resolved_unknown and done.completed_job == job
    assert look.log(held["id"])["status"] == "sent"
    (status,) = look.rows("SELECT status::text AS s, completed_at FROM mdm.aa_job WHERE id = :j",
                          j=job)
    assert status["s"] == "done" and status["completed_at"] is not None
    (audit,) = look.rows("SELECT action, actor, detail FROM mdm.aa_job_audit WHERE job_id = :j",
                         j=job)
    assert (audit["action"], audit["actor"]) == ("job_complete", "feedback")
    assert audit["detail"]["feedback_id"] == str(done.feedback_id)
    assert len(look.rows("SELECT id FROM mdm.aa_email_log WHERE job_id = :j", j=job)) == 1


def test_an_unknown_row_with_a_later_attempt_leaves_the_job_alone(engine, tenant, look):
    with engine.begin() as conn:
        job = insert_job(conn, tenant_id=tenant, kind="email_send", status="dlq")
        held = insert_log(conn, tenant_id=tenant, job_id=job, status="unknown",
                          message_id="<m1@acme.example>")
        insert_log(conn, tenant_id=tenant, job_id=job, status="bounced",
                   message_id="<m1@acme.example>", attempt=2)
    done = record(engine, Feedback(kind="delivered", source="mail", recipient=ANN,
                                   source_event_id="d1", log_id=held["id"]))
    assert done.resolved_unknown and done.completed_job is None
    assert look.rows("SELECT status::text AS s FROM mdm.aa_job WHERE id = :j", j=job) == [
        {"s": "dlq"}]


def test_a_vouched_unsubscribe_suppresses_one_category_without_a_log_row(engine, tenant, look):
    done = record(engine, Feedback(kind="unsubscribe", source="one-click", recipient=ANN,
                                   tenant_id=tenant, category="newsletter", vouched=True,
                                   source_event_id="u1"))
    assert done.suppressed and done.event_type == "email.unsubscribed"
    assert set(look.suppressed(tenant)) == {(ANN, "newsletter")}
    # Not vouched and matching nothing: recorded, no effect.
    stray = record(engine, Feedback(kind="unsubscribe", source="mail", recipient=ANN,
                                    tenant_id=tenant, category="billing",
                                    source_event_id="u2"))
    assert not stray.suppressed and set(look.suppressed(tenant)) == {(ANN, "newsletter")}


def test_two_clicks_on_an_addresss_link_in_one_batch_unsubscribe_once(engine, tenant, look):
    """Two `mailto:` unsubscribes of one address recorded in one batch (or two clicks):
    the first counts; one of another category, or another address, is its own."""
    from postrelay.orchestrator.feedback import record_many

    def click(event_id: str, category: str = "newsletter", to: str = ANN) -> Feedback:
        return Feedback(kind="unsubscribe", source="mail", recipient=to, tenant_id=tenant,
                        category=category, vouched=True, source_event_id=event_id)

    batch = [click("m1"), click("m2"), click("m3", "billing"), click("m4", to="bob@x.example")]
    with engine.begin() as conn:
        done = record_many(conn, batch)
    assert [d.duplicate for d in done] == [False, True, False, False]
    assert set(look.suppressed(tenant)) == {(ANN, "newsletter"), (ANN, "billing"),
                                            ("bob@x.example", "newsletter")}
    assert [e["event_type"] for e in look.events()] == ["email.unsubscribed"] * 3

def test_a_bounce_from_behind_an_alias_suppresses_the_address_sent_to(engine, tenant, look):
    """Sent to info@, an alias that forwards to john@, whose mailbox refuses: the report
    names john@ (Final-Recipient) and info@ (Original-Recipient). info@ is the address
    that will fail again; john@ is kept in the report's detail. An Original-Recipient the
    message never had changes nothing."""
    info, john = "info@forwarding.example", "john@rejecting.example"
    with engine.begin() as conn:
        by_verp = insert_log(conn, tenant_id=tenant, recipients=(info,))
        by_queue = insert_log(conn, tenant_id=tenant, recipients=("desk@forwarding.example",),
                              queue_id="Q-ALIAS")
    forwarded = record(engine, Feedback(kind="bounced", source="mail", recipient=john,
                                        original_recipient=info, status="5.1.1",
                                        source_event_id="fw-1", log_id=by_verp["id"]))
    assert forwarded.suppressed and forwarded.matched_by == "verp"
    queued = record(engine, Feedback(kind="bounced", source="mail", recipient=john,
                                     original_recipient="Desk@Forwarding.example",
                                     status="5.1.1", source_event_id="fw-2",
                                     queue_id="Q-ALIAS"))
    assert queued.email_log_id == by_queue["id"] and queued.suppressed
    claimed = record(engine, Feedback(kind="bounced", source="mail", recipient=john,
                                      original_recipient="other@forwarding.example",
                                      status="5.1.1", source_event_id="fw-3",
                                      message_id=by_verp["message_id"]))
    assert not claimed.suppressed and claimed.email_log_id is None
    assert set(look.suppressed(tenant)) == {(info, ""), ("desk@forwarding.example", "")}
    rows = {r["source_event_id"]: r for r in look.feedback()}
    assert (rows["fw-1"]["recipient"], rows["fw-1"]["detail"]["final_recipient"]) == (info, john)
    assert rows["fw-3"]["recipient"] == john


def test_a_batch_keeps_every_rule_of_one_by_one(engine, tenant, look):
    """record_many: a duplicate inside the batch, soft bounces counted across it, a forged
    report in the middle, and one outbox event for each report about a message."""
    from postrelay.orchestrator.feedback import record_many

    with engine.begin() as conn:
        sent = [insert_log(conn, tenant_id=tenant) for _ in range(3)]
    soft = [Feedback(kind="soft-bounced", source="sendgrid", recipient=ANN, status="4.2.2",
                     source_event_id=f"soft-{i}", message_id=s["message_id"])
            for i, s in enumerate(sent)]
    delivered = Feedback(kind="delivered", source="sendgrid", recipient=ANN,
                         source_event_id="d-1", message_id=sent[0]["message_id"])
    forged = Feedback(kind="bounced", source="sendgrid", recipient="bob@example.com",
                      status="5.1.1", source_event_id="f-1", message_id=sent[0]["message_id"])
    batch = [delivered, soft[0], forged, delivered, soft[1], soft[2]]
    with engine.begin() as conn:
        done = record_many(conn, batch, SuppressionPolicy(soft_limit=3))
    assert [d.duplicate for d in done] == [False, False, False, True, False, False]
    assert [d.suppressed for d in done] == [False, False, False, False, False, True]
    assert done[2].matched_by is None  # a recipient the message never had
    assert set(look.suppressed(tenant)) == {(ANN, "")}
    assert sorted((e["event_type"], e["aggregate_id"]) for e in look.events()) == sorted([
        ("email.delivered", str(sent[0]["id"])), ("email.bounced", str(sent[0]["id"])),
        ("email.bounced", str(sent[1]["id"])), ("email.bounced", str(sent[2]["id"]))])
    assert {e["tenant_id"] for e in look.events()} == {tenant}


def test_a_batch_with_several_reports_about_one_row_applies_them_in_order(engine, tenant, look):
    """record_many: reports about one `unknown` row, in one batch — the first resolves it,
    the highest delivery outcome stays; two that suppress one address: the first does."""
    from postrelay.orchestrator.feedback import record_many

    with engine.begin() as conn:
        row = insert_log(conn, tenant_id=tenant, recipients=(ANN, "bob@example.com"),
                         status="unknown")
    delayed = Feedback(kind="delayed", source="mail", recipient=ANN, status="4.4.1",
                       source_event_id="dsn-1", log_id=row["id"])
    bounced = Feedback(kind="bounced", source="mail", recipient=ANN, status="5.1.1",
                       source_event_id="dsn-2", log_id=row["id"])
    complaint = Feedback(kind="complaint", source="mail", recipient=ANN,
                         source_event_id="arf-1", log_id=row["id"])
    delivered = Feedback(kind="delivered", source="mail", recipient="bob@example.com",
                         source_event_id="dsn-3", log_id=row["id"])
    with engine.begin() as conn:
        done = record_many(conn, [delayed, bounced, complaint, delivered])
    assert [d.resolved_unknown for d in done] == [True, False, False, False]
    assert [d.suppressed for d in done] == [False, True, False, False]
    log = look.log(row["id"])
    assert (log["status"], log["delivery"]) == ("sent", "complained")
    assert f"resolved as sent by feedback {done[0].feedback_id}" in log["error"]
    suppression = look.suppressed(tenant)[(ANN, "")]
    assert suppression["feedback_id"] == done[1].feedback_id
    flags = {r["id"]: r["suppressed"] for r in look.feedback()}
    assert [flags[d.feedback_id] for d in done] == [False, True, False, False]


def test_microsoft_rate_limit_bounces_and_delay_warnings_leave_the_address(engine, tenant, look,
                                                                           return_path):
    """Microsoft 365 refuses with 5.2.121 or 5.2.122 while a recipient gets too much mail in
    an hour ("try again later"): read as 5.2.1 (mailbox disabled), it suppressed at once.
    Its delay warnings (4.4.7, Will-Retry-Until) counted as soft bounces: three suppressed."""
    mails = []
    for code in ("5.2.121", "5.2.122"):
        with engine.begin() as conn:
            sent = insert_log(conn, tenant_id=tenant)
        mails.append(bounce_mail("m365_ndr.eml", verp=return_path.address(sent["id"]),
                                 message_id=sent["message_id"]).replace(b"5.1.10",
                                                                        code.encode()))
    for i in range(3):
        with engine.begin() as conn:
            sent = insert_log(conn, tenant_id=tenant)
        mails.append(bounce_mail("hotmail_delay.eml", verp=return_path.address(sent["id"]),
                                 message_id=sent["message_id"]).replace(
            b"5kSbtyXPf", f"warning{i}".encode()))
    with engine.begin() as conn:
        record_many(conn, [r for raw in mails for r in parse_mail(raw, return_path=return_path)])
    assert sorted((r["kind"], r["status"]) for r in look.feedback()) == [
        ("bounced", "5.2.121"), ("bounced", "5.2.122"), ("delayed", "4.4.7"),
        ("delayed", "4.4.7"), ("delayed", "4.4.7")]
    assert look.suppressed(tenant) == {}


def test_a_batchs_reports_read_back_in_the_order_they_were_recorded(engine, tenant):
    """A SendGrid batch (or a group commit of the inbound receiver) is one transaction: its
    reports shared one received time, and the story showed a bounce before the delay that
    came before it about half the time (the tie went to the feedback rows' random ids)."""
    stories = []
    for i in range(20):
        recipient = f"a{i}@example.com"
        with engine.begin() as conn:
            sent = insert_log(conn, tenant_id=tenant, recipients=(recipient,))
            record_many(conn, [
                Feedback(kind=kind, source="sendgrid", recipient=recipient, status=status,
                         source_event_id=f"{kind}-{i}", message_id=sent["message_id"])
                for kind, status in (("delayed", "4.4.1"), ("bounced", "5.1.1"),
                                     ("delivered", None))])
        with engine.connect() as conn:
            stories.append([f["kind"] for f in email_story(conn, sent["id"])["feedback"]])
    assert all(story == ["delayed", "bounced", "delivered"] for story in stories), stories
