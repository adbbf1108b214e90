"""Feedback holding bytes PostgreSQL cannot store as text: a Latin-1 diagnostic (not UTF-8,
read with `surrogateescape`), a NUL in a report or in a recipient address. Through the real
listener, each is recorded with U+FFFD in their place. Before, the statement refused the
whole batch: a bounce was retried and finally kept as `unparsed` (no suppression, no
event), and an address with a NUL failed the inbox commit of every message beside it."""

from __future__ import annotations

import asyncio

from tests.feedback.conftest import BOUNCE_DOMAIN, await_inbox_empty, bounce_mail, insert_log
from tests.feedback.test_inbound import ANN, deliver

NOT_TEXT = b"\xe0\x00"  # a Latin-1 letter, then a NUL


def report_on_a_sent_row(engine, tenant, return_path, name: str):
    """A `sent` log row, its VERP address, and fixture `name` reporting on it."""
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    verp = return_path.address(sent["id"])
    return sent, verp, bounce_mail(name, verp=verp, message_id=sent["message_id"])


async def test_a_bounce_whose_diagnostic_is_not_text_bounces_and_suppresses(
        inbound, engine, tenant, look, return_path):
    sent, verp, raw = report_on_a_sent_row(engine, tenant, return_path, "postfix_bounce.eml")
    raw = raw.replace(b"Recipient address rejected", b"Destinataire " + NOT_TEXT + b" rejected")
    assert (await deliver(inbound, verp, raw))[0] == 250
    await await_inbox_empty(look.engine)
    (report,) = look.feedback()
    assert report["kind"] == "bounced" and "Destinataire \ufffd\ufffd rejected" in \
        report["diagnostic"]
    assert look.log(sent["id"])["delivery"] == "bounced"
    assert (ANN, "") in look.suppressed(tenant)
    assert [e["event_type"] for e in look.events()] == ["email.bounced"]


async def test_a_complaint_whose_returned_headers_hold_a_nul_is_recorded(
        inbound, engine, tenant, look, return_path):
    _, _, raw = report_on_a_sent_row(engine, tenant, return_path, "yahoo_arf.eml")
    raw = raw.replace(b"Subject: Welcome, Ann!", b"Subject: Welcome " + NOT_TEXT + b" Ann!")
    assert (await deliver(inbound, f"fbl@{BOUNCE_DOMAIN}", raw))[0] == 250
    await await_inbox_empty(look.engine)
    (report,) = look.feedback()
    assert report["kind"] == "complaint"
    assert (ANN, "") in look.suppressed(tenant)


async def deliver_raw(server, rcpt: bytes, raw: bytes) -> bytes:
    """One message over a plain socket (SMTP clients refuse a NUL in a command); the
    server's last reply."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.config.port)
    try:
        await reader.readline()
        replies = []
        for command in (b"HELO mta.example", b"MAIL FROM:<>", b"RCPT TO:<" + rcpt + b">",
                        b"DATA", raw + b".", b"QUIT"):
            writer.write(command + b"\r\n")
            replies.append(await reader.readline())
        return replies[-2]
    finally:
        writer.close()


async def test_a_recipient_address_holding_a_nul_is_stored_beside_the_others(
        inbound, engine, tenant, look, return_path):
    sent, verp, bounce = report_on_a_sent_row(engine, tenant, return_path,
                                              "postfix_bounce.eml")
    odd = b"odd\x00box@" + BOUNCE_DOMAIN.encode()
    odd_reply, (code, _) = await asyncio.gather(
        deliver_raw(inbound, odd, b"Subject: hi\r\n\r\nhello\r\n"),
        deliver(inbound, verp, bounce))
    assert odd_reply.startswith(b"250") and code == 250
    await await_inbox_empty(look.engine)
    assert {r["kind"] for r in look.feedback()} >= {"bounced"}
    assert look.log(sent["id"])["delivery"] == "bounced"
