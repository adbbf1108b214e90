"""A minimal SMTP sink for the email benchmark, run as its own process so that the server's
work does not share the measured process's interpreter:

    python -m bench.smtp_sink PORT [--record FILE] [--delay SECS]

It accepts every message with a Postfix-style 250 reply and keeps nothing, and offers
PIPELINING as Postfix does (aiosmtplib, the raw baseline, does not use it; postrelay does).
For the soak run (bench/soak.py), `--record` appends a line per accepted message to FILE
(its Message-ID and envelope recipients), and `--delay` holds each reply to DATA for up to
SECS (at random), so that many messages are in the middle of being sent when a worker is
killed. It prints `ready` once it listens and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import re
import signal
import threading
from typing import TextIO

from aiosmtpd.controller import Controller

_MESSAGE_ID = re.compile(rb"^Message-ID:[ \t]*(\S+)", re.IGNORECASE | re.MULTILINE)


class CountingHandler:
    def __init__(self, record: TextIO | None = None, delay: float = 0.0) -> None:
        self.ids = itertools.count(1)
        self.record = record
        self.delay = delay

    async def handle_EHLO(self, server, session, envelope, hostname, responses):  # noqa: ANN001, ANN201, N802
        session.host_name = hostname
        responses.insert(-1, "250-PIPELINING")
        return responses

    async def handle_DATA(self, server, session, envelope) -> str:  # noqa: ANN001, N802
        if self.delay:
            await asyncio.sleep(random.random() * self.delay)
        if self.record is not None:
            found = _MESSAGE_ID.search(envelope.original_content or envelope.content)
            message_id = found[1].decode() if found else "-"
            self.record.write(f"{message_id} {' '.join(envelope.rcpt_tos)}\n")
            self.record.flush()  # before the 250: a message the client saw accepted is on file
        return f"250 2.0.0 Ok: queued as B{next(self.ids):08X}"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.smtp_sink")
    parser.add_argument("port", type=int)
    parser.add_argument("--record", type=argparse.FileType("a", encoding="utf-8"))
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    handler = CountingHandler(args.record, args.delay)
    controller = Controller(handler, hostname="127.0.0.1", port=args.port)
    controller.start()
    print("ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    controller.stop()


if __name__ == "__main__":
    main()
