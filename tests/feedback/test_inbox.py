"""The inbound receiver's inbox on a real listener and PostgreSQL: a 250 means the message
is stored, rows outlive the receiver that stored them, and a message that cannot be
recorded is retried, then kept as `unparsed` with its error, never lost."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from postrelay.core.db import sqlalchemy_url
from postrelay.orchestrator.feedback import Feedback, SuppressionPolicy
from postrelay.orchestrator.feedback import inbound as inbound_module
from postrelay.orchestrator.feedback import inbox as inbox_module
from postrelay.orchestrator.feedback.inbound import InboundConfig, InboundServer
from postrelay.orchestrator.feedback.queries import FEEDBACK_SQL
from tests.feedback.conftest import (
    await_inbox_empty,
    bounce_mail,
    generic_plan,
    insert_log,
    node_types,
)
from tests.feedback.test_inbound import deliver, free_port

# Random, so that it does not compress under an index entry's limit (2,704 bytes).
POISON_TEXT = "".join(uuid.uuid4().hex for _ in range(125))


def on_loop(server: InboundServer, coroutine) -> None:
    asyncio.run_coroutine_threadsafe(coroutine, server.loop).result(10)


def receiver(database_url: str, return_path) -> InboundServer:
    # An engine per listener: its connections belong to that listener's loop.
    engine = create_async_engine(sqlalchemy_url(database_url), pool_pre_ping=False)
    config = InboundConfig(host="127.0.0.1", port=free_port(), max_bytes=1024 * 1024)
    return InboundServer(engine, return_path, SuppressionPolicy(), config)


def bounces(engine, tenant, return_path, n: int) -> list[tuple[dict, str, bytes]]:
    with engine.begin() as conn:
        sent = [insert_log(conn, tenant_id=tenant, recipients=(f"u{i}@example.com",))
                for i in range(n)]
    return [(s, return_path.address(s["id"]),
             bounce_mail("postfix_bounce.eml", verp=return_path.address(s["id"]),
                         message_id=s["message_id"], recipient=f"u{i}@example.com"))
            for i, s in enumerate(sent)]


async def test_the_250_comes_once_stored_and_the_next_receiver_records_it(
        database_url, engine, tenant, look, return_path):
    ((sent, verp, raw),) = bounces(engine, tenant, return_path, 1)
    first = receiver(database_url, return_path)
    with first:
        on_loop(first, first.feedback.inbox.stop())  # nothing is recorded from now on
        code, message = await deliver(first, verp, raw)
        assert (code, message) == (250, "2.0.0 OK: queued")
    (row,) = look.rows("SELECT envelope_to, raw, attempts FROM mdm.aa_feedback_inbox")
    assert (row["envelope_to"], bytes(row["raw"]), row["attempts"]) == ([verp], raw, 0)
    assert look.feedback() == []

    with receiver(database_url, return_path):  # rows a stopped receiver left
        await await_inbox_empty(engine)
    assert look.log(sent["id"])["delivery"] == "bounced"
    assert [e["event_type"] for e in look.events()] == ["email.bounced"]


async def test_a_message_that_cannot_be_recorded_is_retried_then_kept_unparsed(
        database_url, engine, tenant, look, return_path, monkeypatch, caplog):
    mails = bounces(engine, tenant, return_path, 3)
    poison = b"Subject: unsubscribe POISON\r\n\r\nx"
    read_mail = inbound_module.read_mail

    def read(raw: bytes, **kwargs):
        if b"POISON" not in raw:
            return read_mail(raw, **kwargs)
        # An unsubscribe from a category longer than a suppression's key may be: the
        # database refuses it every time.
        return [Feedback(kind="unsubscribe", source="mail", recipient="ann@example.com",
                         tenant_id=tenant, category=POISON_TEXT, vouched=True,
                         source_event_id="poison")]

    monkeypatch.setattr(inbound_module, "read_mail", read)
    server = receiver(database_url, return_path)
    with server:
        inbox = server.feedback.inbox
        on_loop(server, inbox.stop())
        inbox.retry_secs, inbox.max_attempts, inbox.poll_secs = 0.01, 3, 0.05
        for _, verp, raw in mails[:2]:
            assert (await deliver(server, verp, raw))[0] == 250
        assert (await deliver(server, mails[0][1], poison))[0] == 250
        assert (await deliver(server, *mails[2][1:]))[0] == 250
        assert (await deliver(server, *mails[2][1:]))[0] == 250  # sent twice
        on_loop(server, server._start_inbox())  # one batch of all five
        await await_inbox_empty(engine)
    assert "postrelay.inbound.batch_failed" in caplog.text
    assert all(look.log(sent["id"])["delivery"] == "bounced" for sent, _, _ in mails)
    assert len(look.events()) == 3
    (kept,) = [r for r in look.feedback() if r["kind"] == "unparsed"]
    assert kept["detail"]["reason"].startswith("not recorded after 3 attempts: "
                                               "ProgramLimitExceeded")
    assert kept["detail"]["envelope_to"] == [mails[0][1]]
    assert "POISON" in kept["detail"]["head"]
    assert len(look.feedback()) == 4


async def test_a_dsn_naming_no_possible_address_is_recorded_with_its_batch(
        database_url, engine, tenant, look, return_path, caplog):
    """Anyone may send mail to the bounce domain. A report naming an 'address' longer than
    an index entry failed its whole batch, every time: the batch was retried a message at a
    time, and the report five times before it was kept as `unparsed`."""
    mails = bounces(engine, tenant, return_path, 2)
    # Folded, as SMTP's lines are 1,000 bytes at most.
    hostile = "\n ".join(POISON_TEXT[i:i + 500] for i in range(0, 4000, 500)) + "@example.com"
    raw = bounce_mail("postfix_bounce.eml", verp=f"postmaster@{return_path.domain}",
                      message_id="<unknown@elsewhere.example>", recipient=hostile)
    server = receiver(database_url, return_path)
    with server:
        on_loop(server, server.feedback.inbox.stop())
        assert (await deliver(server, *mails[0][1:]))[0] == 250
        assert (await deliver(server, f"postmaster@{return_path.domain}", raw))[0] == 250
        assert (await deliver(server, *mails[1][1:]))[0] == 250
        on_loop(server, server._start_inbox())  # one batch of all three
        await await_inbox_empty(engine)
    assert "postrelay.inbound.batch_failed" not in caplog.text
    assert all(look.log(sent["id"])["delivery"] == "bounced" for sent, _, _ in mails)
    (kept,) = [r for r in look.feedback() if r["email_log_id"] is None]
    assert (kept["kind"], kept["recipient"], kept["status"]) == ("bounced", None, "5.1.1")
    assert kept["detail"]["recipient_too_long"] == POISON_TEXT[:254] + "…"
    assert len(look.events()) == 2  # the bounces of the two messages postrelay sent


async def test_recording_waits_while_mail_keeps_coming_and_starts_when_it_stops(
        database_url, engine, tenant, look, return_path):
    """While inbox commits keep coming the processor leaves the loop to the SMTP sessions;
    once none has come for `quiet_secs` it records at once (not `defer_secs` later)."""
    mails = bounces(engine, tenant, return_path, 5)
    server = receiver(database_url, return_path)
    # Mail below keeps coming, one every 0.1 s; the quiet it waits for is far longer, so
    # that a busy machine's slow delivery is not taken for the end of the mail.
    server.feedback.inbox.quiet_secs = 5.0
    server.feedback.inbox.defer_secs = 60.0
    with server:
        for _, verp, raw in mails:
            assert (await deliver(server, verp, raw))[0] == 250
            await asyncio.sleep(0.1)
        assert look.feedback() == []
        await await_inbox_empty(engine, timeout=20)
    assert all(look.log(sent["id"])["delivery"] == "bounced" for sent, _, _ in mails)


async def test_recording_waits_no_longer_than_its_limit(database_url, engine, tenant, look,
                                                         return_path):
    ((sent, verp, raw),) = bounces(engine, tenant, return_path, 1)
    server = receiver(database_url, return_path)
    server.feedback.inbox.quiet_secs = 60.0
    server.feedback.inbox.defer_secs = 0.5
    with server:
        assert (await deliver(server, verp, raw))[0] == 250
        await await_inbox_empty(engine, timeout=20)
    assert look.log(sent["id"])["delivery"] == "bounced"


@pytest.mark.parametrize("stop_first", [True, False])
async def test_stopping_keeps_what_was_not_recorded(database_url, engine, tenant, look,
                                                   return_path, stop_first):
    mails = bounces(engine, tenant, return_path, 20)
    server = receiver(database_url, return_path)
    with server:
        if stop_first:
            on_loop(server, server.feedback.inbox.stop())
        await asyncio.gather(*(deliver(server, verp, raw) for _, verp, raw in mails))
    # Each message is either recorded or still waiting, never both and never lost.
    waiting = look.rows("SELECT count(*) AS n FROM mdm.aa_feedback_inbox")[0]["n"]
    assert waiting + len(look.feedback()) == 20
    if stop_first:
        assert waiting == 20


async def test_a_batch_is_read_oldest_first(database_url, engine, tenant, look, return_path,
                                            monkeypatch):
    mails = bounces(engine, tenant, return_path, 3)
    ids = sorted(uuid.UUID(int=(1 << 120) * (i + 1)) for i in range(3))
    with engine.begin() as conn:  # stored newest first: the table's order is not the ids'
        for inbox_id, (_, verp, raw) in zip(reversed(ids), mails, strict=True):
            conn.exec_driver_sql(
                "INSERT INTO mdm.aa_feedback_inbox (id, envelope_to, raw) "
                "VALUES (%(id)s, ARRAY[%(to)s], %(raw)s)",
                {"id": inbox_id, "to": verp, "raw": raw})
    read_mail = inbound_module.read_mail
    order: list[str] = []

    def read(raw: bytes, **kwargs):
        order.append(kwargs["envelope_to"][0])
        return read_mail(raw, **kwargs)

    monkeypatch.setattr(inbound_module, "read_mail", read)
    with receiver(database_url, return_path):
        await await_inbox_empty(engine)
    assert order == [verp for _, verp, _ in reversed(mails)]
    assert all(look.log(sent["id"])["delivery"] == "bounced" for sent, _, _ in mails)


@pytest.mark.parametrize("take", ["feedback_inbox_take", "feedback_inbox_take_one"])
def test_taking_a_batch_reads_only_its_rows_however_long_the_backlog(engine, clean_db, take):
    """The receiver plans its statements once, generically (cli/feedback.py), often while
    the inbox is empty: taking a batch from a backlog that grew to 20,000 messages since
    must touch the batch's rows through the primary key, not join the whole inbox, or
    draining a backlog after an outage is quadratic."""
    def backlog() -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO mdm.aa_feedback_inbox (envelope_to, raw) "
                "SELECT ARRAY['bounce-x@bounces.acme.example'], 'x'::bytea "
                "FROM generate_series(1, 20000)")
            conn.exec_driver_sql("ANALYZE mdm.aa_feedback_inbox")

    params = {"limit": 100} if take == "feedback_inbox_take" else {"id": str(uuid.uuid4())}
    plan = generic_plan(engine, FEEDBACK_SQL[take], params, grow=backlog)
    scans = [n for n in node_types(plan) if n.startswith("Seq Scan")]
    assert scans == [], node_types(plan)
    assert plan["Shared Hit Blocks"] < 1000  # the whole inbox is about 150 pages


async def test_a_backlog_is_read_two_batches_at_a_time_and_recorded_one_at_a_time(
        database_url, engine, tenant, look, return_path, monkeypatch):
    """Behind a backlog a second batch is read while the first records, but recording and
    its commit stay one batch at a time (a soft bounce counts what the others committed)."""
    mails = bounces(engine, tenant, return_path, 300)
    with engine.begin() as conn:
        for _, verp, raw in mails:
            conn.exec_driver_sql(
                "INSERT INTO mdm.aa_feedback_inbox (envelope_to, raw) "
                "VALUES (ARRAY[%(to)s], %(raw)s)", {"to": verp, "raw": raw})
    busy = {"taking": 0, "recording": 0}
    most = {"taking": 0, "recording": 0}

    def counted(what, function):
        async def wrapper(*args, **kwargs):
            busy[what] += 1
            most[what] = max(most[what], busy[what])
            try:
                return await function(*args, **kwargs)
            finally:
                busy[what] -= 1
        return wrapper

    monkeypatch.setattr(inbox_module, "record_many_async",
                        counted("recording", inbox_module.record_many_async))
    monkeypatch.setattr(inbox_module.InboxProcessor, "_take_and_record",
                        counted("taking", inbox_module.InboxProcessor._take_and_record))
    with receiver(database_url, return_path):
        await await_inbox_empty(engine, timeout=60)
    assert most == {"taking": 2, "recording": 1}
    assert all(look.log(sent["id"])["delivery"] == "bounced" for sent, _, _ in mails)
    assert len(look.feedback()) == 300
