"""Helpers of the SMTP pool and sink tests: a message, a clock the test moves by hand, a wait
on state another thread owns, and aiosmtpd sessions that misbehave by script (`quirky`).
Their fixtures (a trustme CA, sinks on loopback, pools closed after each test) are in
conftest.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any, AnyStr, ClassVar

from aiosmtpd.smtp import SMTP

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


HANG = b"<hang>"  # a reply in a Script: say nothing (until the client hangs up)


@dataclass
class Script:
    """How a `quirky` server misbehaves. `replies` maps a stage to the reply it sends instead
    of aiosmtpd's (bytes, lines joined by CRLF; HANG: none at all): EHLO (the command is then
    refused: the session stays a plain one, as RFC 5321 4.1.4 says), HELO, MAIL, RCPT, DATA
    (its 354), END (the reply to the message, which the handler has kept by then) and RSET.
    The other commands still do what they say: a MAIL answered `251` starts the transaction.
    `close_after`: the stages after whose reply the server hangs up; `withhold`: extensions
    left out of the reply to EHLO ("8BITMIME"). `commands` records the verbs the server was
    sent, in order."""

    replies: dict[str, bytes] = field(default_factory=dict)
    close_after: set[str] = field(default_factory=set)
    withhold: set[str] = field(default_factory=set)
    commands: list[str] = field(default_factory=list)


class QuirkySession(SMTP):
    """aiosmtpd's session, misbehaving as the class's `script` says."""

    script: ClassVar[Script]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stage = "GREETING"

    async def smtp_EHLO(self, hostname: str) -> None:  # noqa: N802 - aiosmtpd's name
        self._command("EHLO")
        refusal = self.script.replies.get("EHLO")
        if refusal is None:
            await super().smtp_EHLO(hostname)
        else:  # refused, and nothing else changes (no extended session)
            await self.push(refusal)

    async def smtp_HELO(self, hostname: str) -> None:  # noqa: N802
        self._command("HELO")
        await super().smtp_HELO(hostname)

    async def smtp_MAIL(self, arg: str | None) -> None:  # noqa: N802
        self._command("MAIL")
        await super().smtp_MAIL(arg)

    async def smtp_RCPT(self, arg: str | None) -> None:  # noqa: N802
        self._command("RCPT")
        await super().smtp_RCPT(arg)

    async def smtp_DATA(self, arg: str) -> None:  # noqa: N802
        self._command("DATA")
        await super().smtp_DATA(arg)

    async def smtp_RSET(self, arg: str) -> None:  # noqa: N802
        self._command("RSET")
        await super().smtp_RSET(arg)

    async def smtp_STARTTLS(self, arg: str) -> None:  # noqa: N802
        self._command("STARTTLS")
        await super().smtp_STARTTLS(arg)

    async def smtp_AUTH(self, arg: str) -> None:  # noqa: N802
        self._command("AUTH")
        await super().smtp_AUTH(arg)

    def _command(self, verb: str) -> None:
        self._stage = verb
        self.script.commands.append(verb)

    async def push(self, status: AnyStr) -> None:
        stage = self._stage
        if stage == "EHLO" and _text(status)[4:].split(" ")[0] in self.script.withhold:
            return  # aiosmtpd pushes the reply to EHLO a line at a time
        replaced = self.script.replies.get(stage) if stage != "EHLO" else None
        if stage == "DATA" and _text(status).startswith("354"):
            self._stage = "END"  # aiosmtpd reads the message next: its reply is END's
        if replaced == HANG:
            await asyncio.get_running_loop().create_future()  # cancelled at the hang-up
        await super().push(replaced if replaced is not None else status)
        if stage in self.script.close_after and self.transport is not None:
            self.transport.close()


def _text(status: AnyStr) -> str:
    return status if isinstance(status, str) else status.decode("ascii", "replace")


def quirky(script: Script) -> type[SMTP]:
    """A session class for SmtpSink(server_class=...) that follows `script`."""
    return type("Quirky", (QuirkySession,), {"script": script})
