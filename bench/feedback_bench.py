"""Feedback ingestion: Postfix DSNs per second through `postrelay inbound` (the real
aiosmtpd listener, parser and record_feedback on PostgreSQL), one process.

    python -m bench.feedback_bench [--dsns 2000] [--connections 10]

Each DSN bounces one log row (hard, 5.1.1): the whole effect is written (feedback row,
log row, suppression, outbox event). Compare with `python -m bench.email_bench`'s send rate.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import string
import time
import uuid
from pathlib import Path

import aiosmtplib
from sqlalchemy import text

from bench.harness import bench_database
from postrelay.orchestrator import ReturnPath
from postrelay.orchestrator.feedback import SuppressionPolicy
from postrelay.orchestrator.feedback.inbound import InboundConfig, InboundServer

FIXTURE = Path(__file__).parent.parent / "tests" / "feedback" / "mail" / "postfix_bounce.eml"
DOMAIN = "bounces.bench.example"


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def _send(port: int, mails: list[tuple[str, bytes]], connections: int) -> None:
    queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
    for item in mails:
        queue.put_nowait(item)

    async def one() -> None:
        smtp = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, timeout=30)
        await smtp.connect()
        while not queue.empty():
            rcpt, raw = queue.get_nowait()
            await smtp.sendmail("", [rcpt], raw)
        await smtp.quit()

    await asyncio.gather(*(one() for _ in range(connections)))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.feedback_bench")
    parser.add_argument("--dsns", type=int, default=2000)
    parser.add_argument("--connections", type=int, default=10)
    args = parser.parse_args()
    path = ReturnPath(DOMAIN, b"bench-feedback-secret-0123456789")
    template = string.Template(FIXTURE.read_text())
    with bench_database() as bench:
        mails = []
        with bench.engine.begin() as conn:
            for i in range(args.dsns):
                log_id, recipient = uuid.uuid4(), f"user{i}@example.com"
                message_id = f"<{uuid.uuid4()}@mail.bench.example>"
                conn.execute(text(
                    "INSERT INTO mdm.aa_email_log (id, tenant_id, template, from_address, "
                    "recipients, to_addresses, message_id, status, attempt) VALUES (:id, :t, "
                    "'welcome', 'noreply@bench.example', ARRAY[:r], ARRAY[:r], :m, 'sent', 1)"),
                    {"id": log_id, "t": bench.tenant_id, "r": recipient, "m": message_id})
                verp = path.address(log_id)
                raw = template.substitute(verp=verp, message_id=message_id,
                                          recipient=recipient, queue_id=f"Q{i}",
                                          domain=DOMAIN).replace("\n", "\r\n")
                raw = raw.replace("<20261201214001.3F2A1B2C3D@mx.example.net>",
                                  f"<dsn-{i}@mx.example.net>")
                mails.append((verp, raw.encode()))
        config = InboundConfig(host="127.0.0.1", port=_port(),
                               max_connections=args.connections + 5)
        with InboundServer(bench.engine, path, SuppressionPolicy(), config) as server:
            started = time.perf_counter()
            asyncio.run(_send(config.port, mails, args.connections))
            elapsed = time.perf_counter() - started
            recorded = server.feedback.recorded
        with bench.engine.connect() as conn:
            suppressed = conn.execute(text(
                "SELECT count(*) FROM mdm.aa_email_suppression")).scalar_one()
        print(f"server: {bench.server}; {args.dsns:,} DSNs over {args.connections} SMTP "
              f"connections, one inbound process")
        print(f"{recorded:,} reports recorded, {suppressed:,} addresses suppressed in "
              f"{elapsed:.2f} s: {args.dsns / elapsed:,.0f} DSNs/s")


if __name__ == "__main__":
    main()
