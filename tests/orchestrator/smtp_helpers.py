"""Helpers of the SMTP pool and sink tests: a message, a clock the test moves by hand, a wait
on state another thread owns. Their fixtures (a trustme CA, sinks on loopback, pools closed
after each test) are in conftest.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from email.message import EmailMessage

SENDER = "app@postrelay.example"


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, secs: float) -> None:
        self.now += secs


def message(to: str = "ann@acme.example", subject: str = "Hello") -> bytes:
    msg = EmailMessage()
    msg["From"] = SENDER
    msg["To"] = to
    msg["Subject"] = subject
    msg.set_content(f"{subject}, {to}.\n")
    return msg.as_bytes()


async def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait until `predicate()` holds (it reports state owned by another thread)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.01)
