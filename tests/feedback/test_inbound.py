"""`postrelay inbound` as a real aiosmtpd listener on loopback, fed by a real SMTP client
the way MTAs deliver bounces (null sender, to the VERP address), over a real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid

import aiosmtplib
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from postrelay.core.db import sqlalchemy_url
from postrelay.orchestrator import ReturnPath, SmtpConfig, SmtpPool
from postrelay.orchestrator.feedback import SuppressionPolicy
from postrelay.orchestrator.feedback.inbound import InboundConfig, InboundServer
from postrelay.orchestrator.replies import SmtpPermanent
from tests.feedback.conftest import (
    SECRET,
    await_inbox_empty,
    bounce_mail,
    free_port,
    insert_log,
)

ANN = "ann@example.com"


async def deliver(server, rcpt: str, raw: bytes,
                  mail_options: tuple[str, ...] = ()) -> tuple[int, str]:
    smtp = aiosmtplib.SMTP(hostname="127.0.0.1", port=server.config.port, timeout=10)
    await smtp.connect()
    try:
        try:
            await smtp.mail("", options=list(mail_options))
        except aiosmtplib.SMTPSenderRefused as exc:
            return exc.code, exc.message
        try:
            await smtp.rcpt(rcpt)
        except aiosmtplib.SMTPRecipientRefused as exc:
            return exc.code, exc.message
        try:
            reply = await smtp.data(raw)
        except aiosmtplib.SMTPDataError as exc:
            return exc.code, exc.message
        except aiosmtplib.SMTPResponseException as exc:
            return exc.code, exc.message
        return reply.code, reply.message
    finally:
        smtp.close()


@pytest.mark.parametrize("name", ["postfix_bounce.eml", "m365_ndr.eml", "gmail_bounce.eml",
                                  "exim_bounce.eml"])
async def test_a_bounce_through_the_listener_bounces_the_row_and_suppresses(
        inbound, engine, tenant, look, return_path, name):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    verp = return_path.address(sent["id"])
    raw = bounce_mail(name, verp=verp, message_id=sent["message_id"])
    assert (await deliver(inbound, verp, raw))[0] == 250
    await await_inbox_empty(look.engine)
    assert look.log(sent["id"])["delivery"] == "bounced"
    assert (ANN, "") in look.suppressed(tenant)
    assert [e["event_type"] for e in look.events()] == ["email.bounced"]
    # The MTA delivers it again (it lost our 250): nothing changes.
    assert (await deliver(inbound, verp, raw))[0] == 250
    await await_inbox_empty(look.engine)
    assert len(look.feedback()) == 1 and len(look.events()) == 1


async def test_bounces_pipelined_as_mtas_send_them_are_each_recorded(
        inbound, engine, tenant, look, return_path):
    """The receiver offers PIPELINING (RFC 2920); an MTA then sends MAIL, RCPT and DATA in
    one write, here postrelay's own SMTP pool over one connection, a refusal among them."""
    with engine.begin() as conn:
        sent = [insert_log(conn, tenant_id=tenant) for _ in range(3)]
    smtp = aiosmtplib.SMTP(hostname="127.0.0.1", port=inbound.config.port, timeout=10)
    await smtp.connect()
    assert smtp.supports_extension("pipelining")
    smtp.close()
    pool = SmtpPool(SmtpConfig(host="127.0.0.1", port=inbound.config.port, pool_size=1))
    try:
        for row in sent:
            verp = return_path.address(row["id"])
            await pool.send("", [verp], bounce_mail("postfix_bounce.eml", verp=verp,
                                                    message_id=row["message_id"]))
        with pytest.raises(SmtpPermanent) as refused:
            await pool.send("", ["postmaster@elsewhere.example"], b"Subject: x\r\n\r\nx\r\n")
        again = return_path.address(sent[0]["id"])
        await pool.send("", [again], bounce_mail("postfix_bounce.eml", verp=again,
                                                 message_id=sent[0]["message_id"]))
    finally:
        await pool.close()
    await await_inbox_empty(look.engine)

    assert refused.value.reply.code == 550  # never an open relay, pipelined or not
    assert pool.connections_opened == 1
    assert [look.log(row["id"])["delivery"] for row in sent] == ["bounced"] * 3
    assert len(look.feedback()) == 3  # the repeated DSN changed nothing


async def test_replies_to_pipelined_commands_leave_together(inbound, engine, tenant, look,
                                                           return_path, written):
    """RFC 2920: the replies to MAIL, RCPT and DATA sent in one write come back in one
    (each 250 waits while the next command is already there); a refusal among them is
    answered in order, and the message still needs its 354."""
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    verp = return_path.address(sent["id"])
    reader, writer = await asyncio.open_connection("127.0.0.1", inbound.config.port)
    try:
        assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"220")
        writer.write(b"EHLO mx.example.net\r\n")
        while not (await asyncio.wait_for(reader.readline(), 5)).startswith(b"250 "):
            pass
        writer.write(b"MAIL FROM:<>\r\nRCPT TO:<%s>\r\nDATA\r\n" % verp.encode())
        replies = await asyncio.wait_for(reader.readuntil(b"354 "), 5) + await reader.readline()
        assert [line[:3] for line in replies.splitlines()] == [b"250", b"250", b"354"]
        assert written[-1].startswith(b"250 ") and written[-1].count(b"\r\n") == 3

        raw = bounce_mail("postfix_bounce.eml", verp=verp, message_id=sent["message_id"])
        writer.write(raw.replace(b"\r\n.", b"\r\n..") + b"\r\n.\r\n")
        assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"250 2.0.0")
        writer.write(b"MAIL FROM:<>\r\nRCPT TO:<x@elsewhere.example>\r\nRCPT TO:<%s>\r\n"
                     b"QUIT\r\n" % verp.encode())
        replies = b""
        while not replies.endswith(b"\r\n") or b"221" not in replies:
            replies += await asyncio.wait_for(reader.read(4096), 5)
        assert [line[:3] for line in replies.splitlines()] == [b"250", b"550", b"250", b"221"]
    finally:
        writer.close()
    await await_inbox_empty(look.engine)
    assert look.log(sent["id"])["delivery"] == "bounced"


async def test_starttls_is_offered_and_a_bounce_arrives_over_it(
        receiver_engine, return_path, clean_db, engine, tenant, look, server_tls, ca_file):
    """With a certificate the receiver offers STARTTLS (on the event loop it runs, uvloop
    where installed): a bounce sent after the upgrade is recorded like any other."""
    config = InboundConfig(host="127.0.0.1", port=free_port(), tls=server_tls)
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    verp = return_path.address(sent["id"])
    with InboundServer(receiver_engine, return_path, SuppressionPolicy(), config):
        smtp = aiosmtplib.SMTP(hostname="127.0.0.1", port=config.port, timeout=10,
                               start_tls=False, cert_bundle=str(ca_file))
        await smtp.connect()
        try:
            await smtp.ehlo()
            assert smtp.supports_extension("starttls")
            await smtp.starttls()
            assert smtp.get_transport_info("sslcontext") is not None
            await smtp.ehlo()
            assert not smtp.supports_extension("starttls")  # offered once, before TLS
            assert (await smtp.execute_command(b"STARTTLS")).code == 503  # RFC 3207 4.2
            # No AUTH, which aiosmtpd offered here with nothing to check a login against.
            assert not smtp.supports_extension("auth")
            assert (await smtp.execute_command(b"AUTH", b"PLAIN", b"AGFubgBzZWNyZXQ=")).code \
                == 502
            await smtp.sendmail("", [verp], bounce_mail(
                "postfix_bounce.eml", verp=verp, message_id=sent["message_id"]))
        finally:
            smtp.close()
        await await_inbox_empty(look.engine)
    assert look.log(sent["id"])["delivery"] == "bounced"


async def test_a_yahoo_complaint_to_the_fbl_address_suppresses(inbound, engine, tenant, look,
                                                               return_path):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    raw = bounce_mail("yahoo_arf.eml", verp=return_path.address(sent["id"]),
                      message_id=sent["message_id"])
    assert (await deliver(inbound, "fbl@bounces.acme.example", raw))[0] == 250
    await await_inbox_empty(look.engine)
    assert look.log(sent["id"])["delivery"] == "complained"
    assert [e["event_type"] for e in look.events()] == ["email.complained"]


async def test_an_arf_opt_out_unsubscribes_from_its_messages_category_only(
        inbound, engine, tenant, look, return_path):
    """A mailbox provider's unsubscribe button reported as ARF `opt-out` was `unparsed`:
    the address kept getting the mail its owner asked to leave. It is an unsubscribe from
    the reported message's category; a complaint would have stopped all mail."""
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, category="newsletter")
    raw = bounce_mail("yahoo_arf.eml", verp=return_path.address(sent["id"]),
                      message_id=sent["message_id"]).replace(
        b"Feedback-Type: abuse", b"Feedback-Type: opt-out")
    assert (await deliver(inbound, "fbl@bounces.acme.example", raw))[0] == 250
    await await_inbox_empty(look.engine)
    (report,) = look.feedback()
    assert (report["kind"], report["email_log_id"]) == ("unsubscribe", sent["id"])
    assert list(look.suppressed(tenant)) == [("ann@example.com", "newsletter")]
    assert [e["event_type"] for e in look.events()] == ["email.unsubscribed"]


async def test_a_delivery_report_resolves_a_held_unknown_row(inbound, engine, tenant, look,
                                                             return_path):
    from tests.factories import insert_job

    with engine.begin() as conn:
        job = insert_job(conn, tenant_id=tenant, kind="email_send", status="dlq")
        held = insert_log(conn, tenant_id=tenant, job_id=job, status="unknown")
    verp = return_path.address(held["id"])
    raw = bounce_mail("postfix_delivered.eml", verp=verp, message_id=held["message_id"])
    assert (await deliver(inbound, verp, raw))[0] == 250
    await await_inbox_empty(look.engine)
    assert look.log(held["id"])["status"] == "sent"
    assert look.rows("SELECT status::text AS s FROM mdm.aa_job WHERE id = :j", j=job) == [
        {"s": "done"}]


async def test_a_bounce_of_mail_signed_before_a_rotation_is_recorded(
        receiver_engine, return_path, clean_db, engine, tenant, look):
    """The receiver of a rotated secret, the old one kept as the previous: the bounce to an
    address the old secret signed passes RCPT and lands on its row."""
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    verp = return_path.address(sent["id"])  # signed before the rotation
    rotated = ReturnPath(return_path.domain, b"the-new-secret-0123456789", previous=SECRET)
    config = InboundConfig(host="127.0.0.1", port=free_port())
    with InboundServer(receiver_engine, rotated, SuppressionPolicy(), config) as server:
        raw = bounce_mail("postfix_bounce.eml", verp=verp, message_id=sent["message_id"])
        assert (await deliver(server, verp, raw))[0] == 250
        await await_inbox_empty(look.engine)
    assert look.log(sent["id"])["delivery"] == "bounced"


async def test_it_is_never_an_open_relay_and_refuses_tampered_tokens(inbound, look,
                                                                     return_path):
    code, message = await deliver(inbound, "victim@elsewhere.example", b"Subject: x\r\n\r\nx")
    assert code == 550 and "relaying denied" in message
    good = return_path.address(uuid.uuid4())
    local, _, domain = good.partition("@")
    tampered = f"{local[:20]}{'b' if local[20] == 'a' else 'a'}{local[21:]}@{domain}"
    code, message = await deliver(inbound, tampered, b"Subject: x\r\n\r\nx")
    assert code == 550 and "signature" in message
    assert look.feedback() == []


async def test_mail_nobody_can_read_is_kept_unparsed(inbound, look, return_path):
    verp = return_path.address(uuid.uuid4())
    raw = b"Content-Type: multipart/report; report-type=delivery-status; boundary=x\r\n\r\n--x"
    assert (await deliver(inbound, verp, raw))[0] == 250
    await await_inbox_empty(look.engine)
    (row,) = look.feedback()
    assert row["kind"] == "unparsed" and row["email_log_id"] is None


async def test_the_domainless_postmaster_is_taken(inbound, look):
    """RFC 5321 4.5.1: `RCPT TO:<Postmaster>` (no domain) MUST be supported."""
    for address in ("Postmaster", "postmaster"):
        code, _ = await deliver(inbound, address, b"Subject: hello %s\r\n\r\nhi"
                                % address.encode())
        assert code == 250
    await await_inbox_empty(look.engine)
    assert [r["kind"] for r in look.feedback()] == ["unparsed", "unparsed"]


async def test_it_recovers_from_a_lost_database_connection_without_a_pre_ping(
        database_url, engine, tenant, look, return_path, clean_db, caplog):
    # The receiver's engine has no pre-ping: a batch that meets a dead connection fails,
    # the connection is dropped, and each message of the batch is recorded again on a new
    # one, so the sender still gets its 250.
    receiver = create_async_engine(sqlalchemy_url(database_url), pool_pre_ping=False,
                                   connect_args={"application_name": "inbound-under-test"})
    config = InboundConfig(host="127.0.0.1", port=free_port(), max_bytes=1024 * 1024)
    with engine.begin() as conn:
        sent = [insert_log(conn, tenant_id=tenant, recipients=(f"u{i}@example.com",))
                for i in range(2)]
    mails = [(return_path.address(s["id"]),
              bounce_mail("postfix_bounce.eml", verp=return_path.address(s["id"]),
                          message_id=s["message_id"], recipient=f"u{i}@example.com"))
             for i, s in enumerate(sent)]
    try:
        with InboundServer(receiver, return_path, SuppressionPolicy(), config) as server:
            assert (await deliver(server, *mails[0]))[0] == 250
            await await_inbox_empty(engine)
            with engine.begin() as conn:  # the database drops the receiver's connection
                killed = conn.execute(text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = 'inbound-under-test'")).scalar_one()
            assert killed >= 1
            assert (await deliver(server, *mails[1]))[0] == 250
            await await_inbox_empty(engine)
    finally:
        receiver.sync_engine.dispose(close=False)
    assert sorted(r["recipient"] for r in look.feedback()) == ["u0@example.com",
                                                               "u1@example.com"]
    assert all(look.log(s["id"])["delivery"] == "bounced" for s in sent)
    assert "postrelay.inbound.batch_failed" in caplog.text  # the lost connection was met
