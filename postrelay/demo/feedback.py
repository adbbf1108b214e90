"""The demo's late feedback: after the sink accepted them, a few messages come back later,
as they do from real receivers — a DSN to the message's VERP address (a mailbox deleted
since, and a full one) and a spam complaint (an ARF report to the bounce domain's feedback
address) — delivered over SMTP to a real `postrelay inbound` listener.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from datetime import UTC, datetime
from email.utils import format_datetime, make_msgid

import aiosmtplib
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.orchestrator import (
    InboundConfig,
    InboundServer,
    ReturnPath,
    SuppressionPolicy,
)
from postrelay.testing import Received

BOUNCE_DOMAIN = "bounces.postrelay.example"
SECRET = "postrelay-demo-feedback-secret"  # the demo's alone; production sets its own
# Recipient -> (Status, the receiving server's words): each bounces after its 250.
LATE_BOUNCES = {
    "user4@acme.example": ("5.1.1", "550 5.1.1 <user4@acme.example>: mailbox deleted"),
    "user4@initech.example": ("4.2.2", "452 4.2.2 <user4@initech.example>: mailbox full"),
}
COMPLAINT = "user3@globex.example"  # marks the welcome mail as spam
FEEDBACK_ADDRESS = f"fbl@{BOUNCE_DOMAIN}"  # registered with the providers' complaint loops


def return_path() -> ReturnPath:
    return ReturnPath(BOUNCE_DOMAIN, SECRET.encode())


def send_late_feedback(engine: AsyncEngine, received: Sequence[Received],
                       policy: SuppressionPolicy) -> tuple[int, int]:
    """Deliver the demo's DSNs and complaint for the messages in `received` to an inbound
    listener of its own (the engine serves that listener's loop alone); returns how many
    DSNs and how many complaints went (on a second run the suppressed addresses were not
    sent to, so fewer come back)."""
    mails = []
    dsns = complaints = 0
    for message in received:
        for recipient in message.recipients:
            if recipient in LATE_BOUNCES:
                status, said = LATE_BOUNCES[recipient]
                mails.append((message.sender, dsn(message, recipient, status, said)))
                dsns += 1
            elif recipient == COMPLAINT:
                mails.append((FEEDBACK_ADDRESS, arf(message, recipient)))
                complaints += 1
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = InboundConfig(host="127.0.0.1", port=port)
    with InboundServer(engine, return_path(), policy, config) as server:
        asyncio.run(_deliver(port, mails))
        server.drain()  # its 250s say stored; the demo shows them recorded
    return dsns, complaints


def describe_late(dsns: int, complaints: int) -> str:
    """What came back, as the demo says it: `3 reports came back later (2 DSNs to their
    VERP addresses, a complaint)`."""
    parts = []
    if dsns:
        parts.append("a DSN to its VERP address" if dsns == 1
                     else f"{dsns} DSNs to their VERP addresses")
    if complaints:
        parts.append("a complaint" if complaints == 1 else f"{complaints} complaints")
    reports = dsns + complaints
    if not reports:
        return "no reports came back later"
    return (f"{reports} report{'' if reports == 1 else 's'} came back later "
            f"({', '.join(parts)})")


async def _deliver(port: int, mails: list[tuple[str, bytes]]) -> None:
    smtp = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, timeout=30)
    await smtp.connect()
    try:
        for rcpt, raw in mails:
            await smtp.sendmail("", [rcpt], raw)  # null sender, as bounces are sent
    finally:
        await smtp.quit()


def dsn(message: Received, recipient: str, status: str, said: str) -> bytes:
    """A Postfix-style delivery status notification (RFC 3464) to the VERP address."""
    action = "failed" if status.startswith("5") else "delayed"
    boundary = "demo-dsn-" + message.queue_id
    return _crlf(f"""\
From: MAILER-DAEMON@mx.{recipient.rpartition("@")[2]} (Mail Delivery System)
To: {message.sender}
Subject: {"Undelivered Mail Returned to Sender" if action == "failed" else
          "Delayed Mail (still being retried)"}
Date: {format_datetime(datetime.now(UTC))}
Message-ID: {make_msgid("dsn", "mx.example.net")}
Auto-Submitted: auto-replied
MIME-Version: 1.0
Content-Type: multipart/report; report-type=delivery-status; boundary="{boundary}"

--{boundary}
Content-Type: text/plain; charset=us-ascii

Your message to <{recipient}> could not be delivered: {said}

--{boundary}
Content-Type: message/delivery-status

Reporting-MTA: dns; mx.example.net

Final-Recipient: rfc822; {recipient}
Action: {action}
Status: {status}
Diagnostic-Code: smtp; {said}

--{boundary}
Content-Type: text/rfc822-headers

{_headers(message)}
--{boundary}--
""")


def arf(message: Received, recipient: str) -> bytes:
    """A mailbox provider's spam complaint (RFC 5965 ARF) about `message`."""
    boundary = "demo-arf-" + message.queue_id
    return _crlf(f"""\
From: feedback-loop@mailbox-provider.example
To: {FEEDBACK_ADDRESS}
Subject: FW: complaint about a message from your network
Date: {format_datetime(datetime.now(UTC))}
Message-ID: {make_msgid("arf", "mailbox-provider.example")}
MIME-Version: 1.0
Content-Type: multipart/report; report-type=feedback-report; boundary="{boundary}"

--{boundary}
Content-Type: text/plain; charset=us-ascii

This is an email abuse report for a message received from your network.

--{boundary}
Content-Type: message/feedback-report

Feedback-Type: abuse
User-Agent: DemoFBL/1.0
Version: 1
Original-Mail-From: <{message.sender}>
Original-Rcpt-To: <{recipient}>

--{boundary}
Content-Type: text/rfc822-headers

{_headers(message)}
--{boundary}--
""")


def _headers(message: Received) -> str:
    lines = [f"Return-Path: <{message.sender}>"]
    for name in ("From", "To", "Subject", "Date", "Message-ID"):
        if message.message[name] is not None:
            lines.append(f"{name}: {' '.join(str(message.message[name]).split())}")
    return "\n".join(lines) + "\n"


def _crlf(text: str) -> bytes:
    return text.replace("\r\n", "\n").replace("\n", "\r\n").encode()
