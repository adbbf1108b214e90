"""The `email_send` handler against a real PostgreSQL and a real SMTP server (aiosmtpd)."""

from __future__ import annotations

import email.policy
from email import message_from_bytes

from pydantic import SecretStr
from sqlalchemy import event, text

from postrelay.testing import drop_after_data, reply, reply_at_data, slow
from tests.orchestrator.conftest import eventually


async def test_a_message_is_sent_and_its_log_row_tells_everything(rig, tenant, sink):
    job_id = rig.enqueue(tenant, to=["Ann Example <ann@example.com>"],
                         cc=("Bob <bob@example.com>",), bcc=("audit@example.com",),
                         reply_to=("help@acme.example",), category="onboarding",
                         context={"user": {"name": "Jürgen <b>"}})
    await rig.start()
    await rig.settle(job_id)
    assert rig.job(job_id)["status"] == "done"
    [row] = rig.log(job_id)
    assert row["status"] == "sent" and row["attempt"] == 1
    assert row["message_id"] == f"<{job_id}@mail.acme.example>"
    assert row["smtp_code"] == 250 and row["smtp_enhanced"] == "2.0.0"
    assert row["queue_id"] and row["queue_id"] in row["smtp_response"]
    assert row["recipients"] == ["ann@example.com", "bob@example.com", "audit@example.com"]
    assert row["subject"] == "Welcome, Jürgen <b>!" and len(row["template_version"]) == 12
    assert row["category"] == "onboarding" and row["finished_at"] is not None
    assert set(row["recipient_results"]) == set(row["recipients"])

    [received] = sink.handler.received
    assert set(received.recipients) == {"ann@example.com", "bob@example.com",
                                        "audit@example.com"}
    parsed = message_from_bytes(received.raw, policy=email.policy.default)
    assert parsed["Message-ID"] == row["message_id"]
    assert parsed["Subject"] == "Welcome, Jürgen <b>!"  # the subject is not escaped
    assert "Bcc" not in parsed and parsed["Reply-To"] == "help@acme.example"
    html = parsed.get_body(("html",)).get_content()
    assert "Jürgen &lt;b&gt;" in html  # HTML is escaped


async def test_a_retry_of_a_sent_message_completes_without_sending(rig, tenant, sink):
    job_id = rig.enqueue(tenant)
    await rig.start()
    await rig.settle(job_id)
    # An operator (or a crash after the outcome commit) runs the job again.
    with rig.engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_job SET status = 'pending', completed_at = NULL "
                          "WHERE id = :id"), {"id": job_id})
    await eventually(lambda: rig.job(job_id)["status"] == "done" and rig.job(job_id)[
        "attempts"] == 2)
    assert sink.handler.count_for("ann@example.com") == 1
    assert [r["status"] for r in rig.log(job_id)] == ["sent"]


async def test_transient_replies_retry_then_send(rig, tenant, sink):
    sink.handler.rules = [("ann@example.com", reply("451 4.3.0 Try again later"))]
    job_id = rig.enqueue(tenant, max_attempts=5)
    await rig.start()
    await eventually(lambda: [r["status"] for r in rig.log(job_id)][:2] == ["deferred"] * 2)
    sink.handler.rules = []
    await rig.settle(job_id)
    rows = rig.log(job_id)
    assert rig.job(job_id)["status"] == "done"
    assert [r["status"] for r in rows][-1] == "sent"
    assert {r["status"] for r in rows[:-1]} == {"deferred"}
    assert rows[0]["smtp_code"] == 451 and rows[0]["smtp_enhanced"] == "4.3.0"
    assert [r["attempt"] for r in rows] == list(range(1, len(rows) + 1))
    assert len({r["message_id"] for r in rows}) == 1  # the same Message-ID on every attempt
    assert sink.handler.count_for("ann@example.com") == 1


async def test_a_5xx_dead_letters_at_once_and_5_1_1_suppresses(rig, tenant, sink):
    sink.handler.rules = [("gone@example.com", reply("550 5.1.1 No such user")),
                          ("blocked@example.com", reply("554 5.7.1 Rejected by policy")),
                          # About the sender's domain, not the recipient: it suppressed
                          # every recipient a misconfigured sender wrote to.
                          ("ann@example.com", reply("553 5.1.8 Domain of sender address "
                                                    "does not exist")),
                          # A full mailbox, whatever code vpopmail gives it: it will empty.
                          ("full@example.com", reply("552 5.1.1 sorry, mailbox full@example"
                                                     ".com is over quota temporarily"))]
    gone = rig.enqueue(tenant, to=["gone@example.com"], max_attempts=5)
    blocked = rig.enqueue(tenant, to=["blocked@example.com"], max_attempts=5)
    sender = rig.enqueue(tenant, to=["ann@example.com"], max_attempts=5)
    full = rig.enqueue(tenant, to=["full@example.com"], max_attempts=5)
    await rig.start()
    await rig.settle(gone, blocked, sender, full)
    for job_id in (gone, blocked, sender, full):
        assert rig.job(job_id)["status"] == "dlq"
        assert rig.job(job_id)["attempts"] == 1  # no retries burnt
        assert [r["status"] for r in rig.log(job_id)] == ["bounced"]
    assert rig.log(gone)[0]["smtp_enhanced"] == "5.1.1"
    # 5.1.1 suppresses the address; a 5.7.1 policy block never does, nor a 5.1.8, nor a
    # 5.1.1 whose reply says the mailbox is over quota.
    assert list(rig.suppressed(tenant)) == ["gone@example.com"]
    assert "5.1.1" in rig.suppressed(tenant)["gone@example.com"]

    later = rig.enqueue(tenant, to=["Gone <GONE@example.com>"])
    await rig.settle(later)
    assert rig.job(later)["status"] == "done"
    [row] = rig.log(later)
    assert row["status"] == "suppressed" and row["smtp_code"] is None
    assert row["recipient_results"] == {"gone@example.com": {"status": "suppressed"}}
    # Only the first attempt reached the server.
    assert [r.recipients for r in sink.handler.refusals if r.status.startswith("550")] == [
        ("gone@example.com",)]


async def test_a_refusal_whose_code_names_no_cause_suppresses_by_its_words(rig, tenant, sink):
    """Yahoo and AOL answer a mailbox that does not exist without an enhanced code,
    Outlook.com with 5.5.0: such an address was mailed at every send, refused every time."""
    sink.handler.rules = [
        ("yahoo@example.com", reply("554 delivery error: dd This user doesn't have a "
                                    "yahoo.com account (yahoo@example.com) [0] - "
                                    "mta1034.mail.ne1.yahoo.com")),
        ("outlook@example.com", reply("550 5.5.0 Requested action not taken: mailbox "
                                      "unavailable (S2017062302)")),
        # RFC 5321's text for any 550, here about a policy; a full mailbox; no cause at all.
        ("policy@example.com", reply("550 Requested action not taken: mailbox unavailable "
                                     "(blocked by policy)")),
        ("full@example.com", reply("552 Requested action not taken: mailbox unavailable, "
                                   "over quota")),
        ("plain@example.com", reply("550 Message refused"))]
    addresses = ["yahoo@example.com", "outlook@example.com", "policy@example.com",
                 "full@example.com", "plain@example.com"]
    jobs = [rig.enqueue(tenant, to=[address], max_attempts=5) for address in addresses]
    await rig.start()
    await rig.settle(*jobs)
    assert [rig.log(job)[0]["status"] for job in jobs] == ["bounced"] * 5
    assert sorted(rig.suppressed(tenant)) == ["outlook@example.com", "yahoo@example.com"]
    assert "dd This user doesn't have" in rig.suppressed(tenant)["yahoo@example.com"]


async def test_a_partly_refused_message_records_each_recipient(rig, tenant, sink):
    sink.handler.rules = [("gone@example.com", reply("550 5.1.1 No such user")),
                          ("busy@example.com", reply("452 4.2.2 Mailbox full"))]
    job_id = rig.enqueue(tenant, to=["ann@example.com", "gone@example.com",
                                     "busy@example.com"])
    await rig.start()
    await rig.settle(job_id)
    assert rig.job(job_id)["status"] == "done"
    [row] = rig.log(job_id)
    assert row["status"] == "partial"
    results = row["recipient_results"]
    assert results["ann@example.com"]["status"] == "accepted"
    assert results["gone@example.com"] == {"status": "refused", "code": 550,
                                           "enhanced": "5.1.1", "text": "No such user"}
    assert results["busy@example.com"]["code"] == 452
    assert list(rig.suppressed(tenant)) == ["gone@example.com"]
    assert sink.handler.count_for("ann@example.com") == 1


async def test_a_refusal_at_data_bounces(rig, tenant, sink):
    sink.handler.rules = [("ann@example.com", reply_at_data("552 5.3.4 Message too big"))]
    job_id = rig.enqueue(tenant)
    await rig.start()
    await rig.settle(job_id)
    assert rig.job(job_id)["status"] == "dlq"
    [row] = rig.log(job_id)
    assert (row["status"], row["smtp_code"], row["smtp_enhanced"]) == ("bounced", 552, "5.3.4")
    assert rig.suppressed(tenant) == {}


async def test_a_dropped_connection_after_data_and_a_slow_server_are_retried(rig, tenant, sink):
    """Dropped once the message went, the outcome is unknown (the server may have it);
    slow before it went, the attempt is only deferred. Both are retried."""
    sink.handler.rules = [("drop@example.com", drop_after_data()),
                          ("slow@example.com", slow(3.0))]
    dropped = rig.enqueue(tenant, to=["drop@example.com"], max_attempts=2)
    slowed = rig.enqueue(tenant, to=["slow@example.com"], max_attempts=2)
    await rig.start()
    await rig.settle(dropped, slowed)
    for job_id, status in ((dropped, "unknown"), (slowed, "deferred")):
        rows = rig.log(job_id)
        assert [r["status"] for r in rows] == [status, status]
        assert rig.job(job_id)["status"] == "dlq" and rig.job(job_id)["attempts"] == 2
    assert "whether the server accepted it is not known" in rig.log(dropped)[0]["error"]
    # The server kept what it received before dropping: delivery is at least once.
    assert sink.handler.count_for("drop@example.com") == 2


async def test_throttling_replies_are_retried(
    rig, tenant, sink
):
    sink.handler.rules = [("ann@example.com", reply("421 4.7.0 Too many connections"))]
    throttled = rig.enqueue(tenant, max_attempts=5)
    await rig.start()
    await eventually(lambda: any(r["status"] == "deferred" for r in rig.log(throttled)))
    sink.handler.rules = []
    await rig.settle(throttled)
    rows = rig.log(throttled)
    assert rows[0]["status"] == "deferred" and rows[0]["smtp_code"] == 421
    assert rows[-1]["status"] == "sent"
    # Every worker was told to slow down: email_send as a whole, with the reply as reason.
    with rig.engine.connect() as conn:
        audit = conn.execute(text(
            "SELECT job_kind::text, detail->>'key', detail->>'reason' FROM mdm.aa_flow_audit "
            "WHERE action = 'throttle_started'")).all()
    [(kind, key, reason)] = audit
    assert (kind, key) == ("email_send", "") and "421 4.7.0 Too many connections" in reason


async def test_invalid_addresses_and_header_injection_fail_permanently_unsent(
    rig, tenant, sink
):
    bad_address = rig.enqueue_raw(tenant, to=["not an address"])
    injected_subject = rig.enqueue(tenant, context={"user": {"name": "x\r\nBcc: all@evil.example"}})
    encoded_name = rig.enqueue_raw(tenant, to=["=?utf-8?q?Ann=0D=0ABcc:_x@evil.example?= "
                                               "<ann@example.com>"])
    await rig.start()
    await rig.settle(bad_address, injected_subject, encoded_name)
    for job_id, field in ((bad_address, "to"), (injected_subject, "subject"),
                          (encoded_name, "to")):
        job = rig.job(job_id)
        assert job["status"] == "dlq" and job["attempts"] == 1
        [row] = rig.log(job_id)
        assert row["status"] == "failed" and field in row["error"]
    assert "line break" in rig.log(injected_subject)[0]["error"]
    assert sink.handler.received == [] and sink.connections == 0


async def test_bad_credentials_pause_sending_without_failing_the_jobs(
    engine, async_engine, libpq, templates_dir, tenant
):
    from postrelay.orchestrator import SmtpConfig, SmtpPool
    from postrelay.testing import ScriptedHandler, SmtpSink
    from tests.orchestrator.conftest import Rig

    with SmtpSink(ScriptedHandler(), auth={"mailer": "right"}, auth_require_tls=False) as sink:
        rig = Rig(engine, async_engine, libpq, sink, templates_dir)
        rig.pool = SmtpPool(SmtpConfig(host=sink.host, port=sink.port, username="mailer",
                                       password=SecretStr("wrong"), auth_pause_secs=0.5,
                                       timeout_secs=2))
        try:
            # One attempt each: a failure that counted would dead-letter them at once.
            jobs = [rig.enqueue(tenant, to=[f"user{n}@example.com"], max_attempts=1)
                    for n in range(3)]
            await rig.start()
            await eventually(lambda: any(r["smtp_code"] == 535 for r in rig.log()))
            sink.credentials["mailer"] = "wrong"  # the operator fixes the account
            await rig.settle(*jobs)
        finally:
            await rig.stop()
        for job_id in jobs:
            assert rig.job(job_id)["status"] == "done" and rig.job(job_id)["attempts"] == 1
        rows = rig.log()
        refused = [r for r in rows if r["status"] == "deferred"]
        # Attempts that met the 535, or the pause it began while they waited for a
        # connection, are logged; each job was sent once.
        assert any(r["smtp_code"] == 535 for r in refused)
        assert all(r["smtp_code"] == 535 or "paused" in r["error"] for r in refused)
        assert sorted(r["status"] for r in rows if r["status"] != "deferred") == ["sent"] * 3
        assert len(sink.handler.received) == 3


async def test_a_sent_message_is_not_failed_by_a_template_broken_since(
    rig, tenant, sink, templates_dir
):
    job_id = rig.enqueue(tenant)
    await rig.start()
    await rig.settle(job_id)
    (templates_dir / "welcome" / "body.txt").write_text("{{ missing.variable }}\n")
    with rig.engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_job SET status = 'pending', completed_at = NULL "
                          "WHERE id = :id"), {"id": job_id})
    await eventually(lambda: rig.job(job_id)["status"] == "done" and rig.job(job_id)[
        "attempts"] == 2)
    assert [r["status"] for r in rig.log(job_id)] == ["sent"]
    assert len(sink.handler.received) == 1


async def test_a_cold_worker_looks_its_tenant_up_once_for_a_full_queue(
    rig, tenant, sink, async_engine
):
    # Every job needs the tenant's name (its template folder); a worker that starts with a
    # full queue must not send one lookup per running job.
    lookups: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        if "FROM mdm.aa_tenant WHERE id" in statement:
            lookups.append(statement)

    jobs = [rig.enqueue(tenant, to=[f"user{n}@example.com"]) for n in range(20)]
    event.listen(async_engine.sync_engine, "before_cursor_execute", record)
    try:
        await rig.start(concurrency=20)
        await rig.settle(*jobs)
    finally:
        event.remove(async_engine.sync_engine, "before_cursor_execute", record)
    assert [rig.job(j)["status"] for j in jobs] == ["done"] * 20
    assert len(sink.handler.received) == 20
    assert len(lookups) == 1


async def test_long_subjects_and_display_names_are_folded_and_sent_intact(
        rig, tenant, sink, templates_dir):
    """Issue 18: a subject or display name compat32 could not fold made a header line over
    RFC 5322's 998 octets; the server refused the message and it was logged `bounced`, as if
    the recipient had refused it. Folded correctly, each is sent, and reads back the same."""
    from email.header import decode_header, make_header
    from email.utils import getaddresses

    from tests.orchestrator.conftest import write_template

    write_template(templates_dir, "long", "{{ subject }}", "Hello.\n")
    subjects = ["A" * 1500, " ".join(["shipment"] * 300), "Grüße aus Köln " * 120,
                "😀中文" * 300]
    name = "Acme " + "Customer-Service-" * 80
    jobs = {rig.enqueue(tenant, template="long", context={"subject": subject},
                        sender=f"{name} <noreply@acme.example>",
                        to=[f"{'Jürgen Müller ' * 60}<ann@example.com>"]): subject.strip()
            for subject in subjects}
    await rig.start()
    await rig.settle(*jobs)
    for job_id in jobs:
        assert rig.job(job_id)["status"] == "done", rig.job(job_id)
        assert [r["status"] for r in rig.log(job_id)] == ["sent"]
    assert rig.suppressed(tenant) == {}
    received = {message_from_bytes(m.raw, policy=email.policy.default)["Subject"]: m
                for m in sink.handler.received}
    assert set(received) == set(jobs.values())  # every subject parses back as it was
    for message in received.values():
        head = message.raw.split(b"\r\n\r\n", 1)[0]
        assert max(len(line) for line in head.split(b"\r\n")) <= 998
        raw = message_from_bytes(message.raw, policy=email.policy.compat32)
        (sender,) = getaddresses([raw["From"].replace("\r\n", "")])
        assert (str(make_header(decode_header(sender[0]))), sender[1]) == (
            name.strip(), "noreply@acme.example")
        (to,) = getaddresses([raw["To"].replace("\r\n", "")])
        assert str(make_header(decode_header(to[0]))) == ("Jürgen Müller " * 60).strip()


async def test_an_unfoldable_header_fails_the_job_as_bad_input_never_as_a_bounce(
        rig, tenant, sink):
    """What cannot be folded (here a Message-ID domain longer than a DNS name) is refused
    before anything is sent: `failed` in the log with the header named, the job in the DLQ
    without retries, no recipient counted as refusing and no address suppressed."""
    from postrelay.orchestrator.handler import email_registry
    from postrelay.orchestrator.templates import Templates
    from postrelay.queue.backoff import FixedBackoff
    from postrelay.queue.worker import Worker, WorkerConfig

    job_id = rig.enqueue(tenant)
    registry = email_registry(rig.async_engine, Templates(rig.templates, reload_secs=0),
                              rig.pool, message_id_domain=".".join(["m" * 60] * 5))
    worker = Worker(rig.async_engine, WorkerConfig(poll_interval_secs=0.1, grace_secs=1.0),
                    registry=registry, backoff=FixedBackoff(0.05), listen_url=rig.libpq)
    await worker.start()
    rig.workers.append((worker, registry))
    await rig.settle(job_id)
    job = rig.job(job_id)
    assert job["status"] == "dlq" and job["attempts"] == 1
    assert "message_id_domain: is 304 characters" in job["last_error"]
    [row] = rig.log(job_id)
    assert row["status"] == "failed" and "message_id_domain" in row["error"]
    assert row["smtp_code"] is None and row["recipient_results"] is None
    assert rig.suppressed(tenant) == {}
    assert sink.handler.received == [] and sink.connections == 0


async def test_a_body_a_template_renders_with_a_lone_surrogate_fails_once_with_a_log_row(
        rig, tenant, sink):
    """A Jinja escape (`"\\udc80"`) renders a character UTF-8 has no form for: encoding the
    body raised UnicodeEncodeError, which the worker took for a passing failure, retried
    until dead with no log row. It is bad input, named, like a subject's."""
    from tests.orchestrator.conftest import write_template

    write_template(rig.templates, "lone_text", "Hi", 'a {{ "\\udc80" }} b\n')
    write_template(rig.templates, "lone_html", "Hi", "fine\n", '<p>{{ "\\ud800" }}</p>')
    text_job = rig.enqueue(tenant, template="lone_text")
    html_job = rig.enqueue(tenant, template="lone_html")
    await rig.start()
    await rig.settle(text_job, html_job)
    for job_id, field in ((text_job, "text"), (html_job, "html")):
        job = rig.job(job_id)
        assert job["status"] == "dlq" and job["attempts"] == 1
        [row] = rig.log(job_id)
        assert row["status"] == "failed" and row["error"].startswith(f"{field}: ")
        assert "surrogate" in row["error"]
    assert sink.handler.received == []
