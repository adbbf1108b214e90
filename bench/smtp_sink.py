"""A minimal SMTP sink for the email benchmark, run as its own process so that the server's
work does not share the measured process's interpreter:

    python -m bench.smtp_sink PORT

It accepts every message with a Postfix-style 250 reply and keeps nothing; it prints
`ready` once it listens and stops on SIGTERM.
"""

from __future__ import annotations

import itertools
import signal
import sys
import threading

from aiosmtpd.controller import Controller


class CountingHandler:
    def __init__(self) -> None:
        self.ids = itertools.count(1)

    async def handle_DATA(self, server, session, envelope) -> str:  # noqa: ANN001, N802
        return f"250 2.0.0 Ok: queued as B{next(self.ids):08X}"


def main() -> None:
    port = int(sys.argv[1])
    controller = Controller(CountingHandler(), hostname="127.0.0.1", port=port)
    controller.start()
    print("ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    controller.stop()


if __name__ == "__main__":
    main()
