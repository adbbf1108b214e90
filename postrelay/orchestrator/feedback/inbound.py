"""`postrelay inbound`: the SMTP server the bounce domain's MX points at.

It accepts mail only for addresses on the bounce domain (never an open relay), refuses a
VERP address whose token postrelay did not sign, caps the message size and the number of
connections, optionally offers STARTTLS, and records every message it accepts through the
feedback parser. A message is acknowledged (250) once it is stored durably in the inbox
(spool.py, a commit flushed to the WAL); a database failure answers 451 so the sending MTA
keeps the message and tries again. The inbox is recorded right after, on the same event
loop, in batches (inbox.py); new mail waits while that lags (intake.py).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable
from dataclasses import dataclass

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.eventloop import new_event_loop
from postrelay.core.telemetry import event
from postrelay.orchestrator.feedback.inbox import InboxProcessor
from postrelay.orchestrator.feedback.ingest import read_mail
from postrelay.orchestrator.feedback.intake import HIGH_WATER, MAX_DELAY_SECS, Intake
from postrelay.orchestrator.feedback.model import Feedback, SuppressionPolicy
from postrelay.orchestrator.feedback.session import Gate, ReceiverSession
from postrelay.orchestrator.feedback.spool import InboxSpool
from postrelay.orchestrator.feedback.unsubscribe import UnsubscribeLinks
from postrelay.orchestrator.feedback.verp import PREFIX, ReturnPath, TokenError

DEFAULT_MAX_BYTES = 5 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS = 50


@dataclass(frozen=True)
class InboundConfig:
    # "" is every address of both families (asyncio binds one socket per family); "::"
    # alone is IPv6 only, as asyncio sets IPV6_V6ONLY.
    host: str = "0.0.0.0"
    port: int = 25
    max_bytes: int = DEFAULT_MAX_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    tls: ssl.SSLContext | None = None  # offered with STARTTLS when given
    # Reads `mailto:` unsubscribes (to unsubscribe@<bounce domain>) when given.
    unsubscribe: UnsubscribeLinks | None = None
    # A session that sends nothing this long is closed (aiosmtpd's default); one whose
    # message is still arriving, however slowly, is not.
    idle_timeout_secs: float = 300.0
    # New mail waits while this many stored messages are not yet taken to be recorded, for
    # intake_delay_secs at most (intake.py).
    intake_high_water: int = HIGH_WATER
    intake_delay_secs: float = MAX_DELAY_SECS
    # Share the port with other receivers that set it too (SO_REUSEPORT: the kernel spreads
    # new connections over them), as `postrelay inbound --processes` runs them. Off, a
    # second receiver on a port in use fails to start, as a port clash should.
    reuse_port: bool = False


class FeedbackHandler:
    """aiosmtpd hooks: RCPT decides what is accepted, DATA stores it in the inbox, whose
    processor records it."""

    def __init__(self, engine: AsyncEngine, return_path: ReturnPath, policy: SuppressionPolicy,
                 max_bytes: int, unsubscribe: UnsubscribeLinks | None = None,
                 high_water: int = HIGH_WATER, max_delay_secs: float = MAX_DELAY_SECS) -> None:
        self.engine = engine
        self.return_path = return_path
        self.unsubscribe = unsubscribe
        self.policy = policy
        self.max_bytes = max_bytes
        self.queued = 0
        self.intake = Intake(high_water, max_delay_secs)
        self.inbox = InboxProcessor(engine, self.read, policy, intake=self.intake)
        self.spool = InboxSpool(engine, on_commit=self._stored)

    async def handle_EHLO(  # noqa: N802 - aiosmtpd's hook name
            self, server: SMTP, session: Session, envelope: Envelope, hostname: str,
            responses: list[str]) -> list[str]:
        # PIPELINING (RFC 2920): MTAs then send MAIL, RCPT and DATA in one packet, which
        # the session reads in order from its buffer, one wake-up instead of three.
        # CHUNKING (RFC 3030, chunking.py): those that use it send the message in that
        # packet too, and the DSN costs one round trip.
        session.host_name = hostname  # this hook's duty (aiosmtpd's own EHLO leaves it)
        # aiosmtpd offers AUTH after STARTTLS, with no authenticator to check a login: an
        # MTA with credentials for every host tried it, met 535, and kept the bounce.
        responses = [r for r in responses if not r.startswith("250-AUTH")]
        responses[-1:-1] = ["250-PIPELINING", "250-CHUNKING"]
        return responses

    async def handle_RCPT(  # noqa: N802 - aiosmtpd's hook name
            self, server: SMTP, session: Session, envelope: Envelope, address: str,
            rcpt_options: list[str]) -> str:
        # RFC 5321 4.5.1: `RCPT TO:<Postmaster>`, without a domain, must be taken.
        if not self.return_path.is_ours(address) and address.lower() != "postmaster":
            event("postrelay.inbound.relay_refused", logging.WARNING, rcpt=address,
                  peer=str(session.peer))
            return f"550 5.7.1 relaying denied: only mail for {self.return_path.domain}"
        if address.lower().startswith(PREFIX):
            try:
                self.return_path.log_id(address)
            except TokenError as exc:
                event("postrelay.inbound.token_refused", logging.WARNING, rcpt=address,
                      rule=exc.rule)
                return f"550 5.1.1 no such mailbox ({exc.rule})"
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 OK"

    async def handle_DATA(  # noqa: N802 - aiosmtpd's hook name
            self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content or envelope.content or b""
        if isinstance(raw, str):
            raw = raw.encode("utf-8", "surrogateescape")
        await self.intake.room()  # while the processor lags
        try:
            await self.spool.store(envelope.rcpt_tos, raw)
        except Exception as exc:  # the database: the sender keeps the message and retries
            event("postrelay.inbound.record_failed", logging.ERROR, error=repr(exc))
            return "451 4.3.0 could not record the message now; try again later"
        self.queued += 1
        return "250 2.0.0 OK: queued"

    def _stored(self, count: int) -> None:
        self.intake.stored(count)
        self.inbox.wake()

    def read(self, envelope_to: list[str], raw: bytes) -> list[Feedback]:
        """The reports of one message of the inbox."""
        return read_mail(raw, envelope_to=envelope_to, return_path=self.return_path,
                         max_bytes=self.max_bytes, unsubscribe=self.unsubscribe)


class InboundServer(Controller):
    """aiosmtpd's threaded controller running the feedback handler and its inbox
    processor, on uvloop where it is installed (core/eventloop.py). The async engine is
    used on the controller's event loop alone (its connections belong to that loop); no
    pre-ping is needed: a batch that fails on a lost connection is retried a message at a
    time, on new connections.

        with InboundServer(async_engine, return_path, policy, InboundConfig(port=2525)) as s:
            ...  # s.port
    """

    def __init__(self, engine: AsyncEngine, return_path: ReturnPath, policy: SuppressionPolicy,
                 config: InboundConfig) -> None:
        self.config = config
        self.feedback = FeedbackHandler(engine, return_path, policy, config.max_bytes,
                                        config.unsubscribe, config.intake_high_water,
                                        config.intake_delay_secs)
        self._gate = Gate(config.max_connections)
        super().__init__(self.feedback, hostname=config.host, port=config.port,
                         loop=new_event_loop())

    def factory(self) -> SMTP:
        return ReceiverSession(self.handler, gate=self._gate, data_size_limit=self.config.max_bytes,
                       tls_context=self.config.tls, require_starttls=False,
                       # A report that needs it (RFC 6531/6533: UTF-8 in the headers it
                       # returns) goes only to a server that offers it; Postfix drops it
                       # otherwise. Messages are kept as bytes either way.
                       enable_SMTPUTF8=True,
                       hostname=self.feedback.return_path.domain,
                       ident="postrelay inbound", timeout=self.config.idle_timeout_secs)

    def _create_server(self) -> Awaitable[asyncio.AbstractServer]:
        return self.loop.create_server(self._factory_invoker, host=self.hostname,
                                       port=self.port, ssl=self.ssl_context,
                                       reuse_port=self.config.reuse_port)

    def _trigger_server(self) -> None:
        # aiosmtpd connects to the new listener once to see its factory work. On a shared
        # port the kernel may hand that connection to another process, and this one would
        # wait for it in vain: the factory is tried on the loop instead.
        if self.config.reuse_port:
            self.loop.call_soon_threadsafe(self._factory_invoker)
        else:
            super()._trigger_server()  # type: ignore[no-untyped-call]

    def start(self) -> None:
        super().start()
        # The processor runs on the listener's loop, beside the SMTP sessions.
        asyncio.run_coroutine_threadsafe(self._start_inbox(), self.loop).result()

    async def _start_inbox(self) -> None:
        self.feedback.inbox.start()

    def drain(self, timeout: float = 30.0) -> int:
        """Record what the inbox holds now, before returning (a demo, a test); how many
        messages this took. A batch the processor holds is finished by stop()."""
        async def until_empty() -> int:
            taken = 0
            while took := await self.feedback.inbox.process_once():
                taken += took
            return taken
        return asyncio.run_coroutine_threadsafe(until_empty(), self.loop).result(timeout)

    def stop(self, no_assert: bool = False) -> None:
        if self.loop.is_running():  # its batch finishes or is abandoned, its rows kept
            asyncio.run_coroutine_threadsafe(self._stop_inbox(), self.loop).result()
        super().stop(no_assert)

    async def _stop_inbox(self) -> None:
        await self.feedback.inbox.stop()
        await self.feedback.spool.close()

    def __enter__(self) -> InboundServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
