"""SMTP transport: a pool of reused aiosmtplib connections that reports what the server said.

    pool = SmtpPool(SmtpConfig.from_settings(settings))
    delivery = await pool.send("app@acme.example", ["ann@acme.example"], message_bytes)
    delivery.queue_id, delivery.refused    # "4F3A2B", {} (refusals of a partial delivery)
    await pool.close()

aiosmtplib connects, says EHLO (HELO where the server does not know EHLO: greeting.py),
starts TLS and logs in; each message then goes through the connection's `Dialogue`
(orchestrator/dialogue.py), which sends MAIL FROM, the RCPT TOs and DATA in one write when the
server offers PIPELINING, and the message in that write too, as one BDAT chunk, when it
offers CHUNKING as well (Postfix since 3.4, Exchange, Gmail). Any 2xx reply is a success.

Failures are `SmtpError`s that say where they happened (`stage`) and what the server
replied (orchestrator/replies.py; verdicts.py for replies that are not the one due):
`SmtpTransient` (retry later), `SmtpPermanent` (dead-letter), `SmtpAnswerLost` (the message
went and no yes or no came back), `SmtpConfigError` (the server cannot be used as
configured). After a 421/454 the pool waits before its next send, after an authentication
failure it refuses to send for a while.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

import aiosmtplib
from pydantic import SecretStr

from postrelay.core.errors import ConfigError, PostrelayError, ValidationError
from postrelay.core.telemetry import event
from postrelay.orchestrator.dialogue import Dialogue, envelope_address
from postrelay.orchestrator.greeting import check_plain_session, greet
from postrelay.orchestrator.replies import (
    Delivery,
    Reply,
    SmtpAnswerLost,
    SmtpAuthFailed,
    SmtpConfigError,
    SmtpError,
    SmtpPaused,
    SmtpPermanent,
    SmtpThrottled,
    SmtpTransient,
    classify,
    queue_id_from,
    step,
)
from postrelay.orchestrator.verdicts import check_size, final_read, needs_smtputf8, not_positive

if TYPE_CHECKING:
    from postrelay.core.settings import Settings

Security = Literal["none", "starttls", "tls"]
_OK = 250  # the usual positive reply; any 2yz is one (RFC 5321 4.2.1)
_START_INPUT = 354


@dataclass(frozen=True)
class SmtpConfig:
    """Where and how to reach the SMTP server; `from_settings` reads the `smtp_*` settings."""

    host: str = "localhost"
    port: int = 25
    security: Security = "none"
    username: str | None = None
    password: SecretStr | None = field(default=None, repr=False)
    timeout_secs: float = 30.0
    pool_size: int = 10
    validate_certs: bool = True
    ca_file: Path | None = None
    throttle_secs: float = 5.0
    auth_pause_secs: float = 60.0
    chunking: bool = True  # BDAT where the server offers CHUNKING and PIPELINING

    def __post_init__(self) -> None:
        if self.security not in ("none", "starttls", "tls"):
            raise ValidationError("smtp_security", "one of none, starttls, tls")
        if self.pool_size < 1:
            raise ValidationError("smtp_pool_size", "at least 1")

    @classmethod
    def from_settings(cls, settings: Settings) -> SmtpConfig:
        """`SmtpConfig.from_settings(load_settings())`: the POSTRELAY_SMTP_* values."""
        return cls(
            host=settings.smtp_host, port=settings.smtp_port, security=settings.smtp_security,
            username=settings.smtp_username, password=settings.smtp_password,
            timeout_secs=settings.smtp_timeout_secs, pool_size=settings.smtp_pool_size,
            validate_certs=settings.smtp_validate_certs, ca_file=settings.smtp_ca_file,
            throttle_secs=settings.smtp_throttle_secs,
            auth_pause_secs=settings.smtp_auth_pause_secs, chunking=settings.smtp_chunking,
        )


class SendProgress:
    """How far one `send` got: `began` once its first command was written to a server.
    Before that (waiting for a free connection or a throttle, connecting), a stop cannot
    have left the message with the server."""

    __slots__ = ("began",)

    def __init__(self) -> None:
        self.began = False


class _StaleConnection(Exception):
    """A reused connection turned out dead before MAIL FROM was accepted."""


class SmtpPool:
    """Up to `config.pool_size` SMTP connections, reused across sends (idle ones in a LIFO).
    `clock` (monotonic seconds) decides when a throttle or an auth pause ends; tests pass a
    fake one to end a pause without sleeping."""

    def __init__(self, config: SmtpConfig, *, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self._clock = clock
        self._tls = _tls_context(config)
        self._slots = asyncio.Semaphore(config.pool_size)
        # LIFO: the most recently used connection is the least likely to have been closed
        # by the server's idle timer, and the others can time out and be dropped.
        self._idle: list[Dialogue] = []
        self._local_hostname: str | None = None
        self._throttled_until = 0.0
        self._paused_until = 0.0
        self._closed = False
        self.connections_opened = 0
        self.messages_sent = 0

    def paused_for(self) -> float:
        """Seconds left of the pause after an authentication failure (0.0: not paused)."""
        return max(0.0, self._paused_until - self._clock())

    async def send(self, sender: str, recipients: Sequence[str], message: bytes,
                   progress: SendProgress | None = None) -> Delivery:
        """Deliver `message` (RFC 5322 bytes) to `recipients` in one SMTP transaction.

        Returns when the server accepted it for at least one recipient (`Delivery.refused`
        holds the others); raises an `SmtpError` otherwise. Never retried once DATA began.
        `progress.began` tells a caller stopped meanwhile whether the transaction began.
        """
        _check_addresses(sender, recipients)
        self._check_can_send()
        async with self._slots:
            await self._wait_out_throttle()
            self._check_can_send()  # the wait may have been long: closed or paused since?
            try:
                try:
                    return await self._attempt(sender, recipients, message, progress,
                                               reuse=True)
                except _StaleConnection:
                    # Nothing was accepted yet, so sending on a fresh connection is safe,
                    # and a stop while it connects leaves nothing with a server.
                    if progress is not None:
                        progress.began = False
                    event("postrelay.smtp.reconnect", logging.DEBUG, host=self.config.host)
                    return await self._attempt(sender, recipients, message, progress,
                                               reuse=False)
            except SmtpError as exc:
                self._react(exc)
                raise

    async def close(self) -> None:
        """QUIT the idle connections; those in use are closed when their send ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        await asyncio.gather(*(dialogue.quit() for dialogue in idle))

    async def _attempt(
        self, sender: str, recipients: Sequence[str], message: bytes,
        progress: SendProgress | None, *, reuse: bool
    ) -> Delivery:
        dialogue = self._take_idle() if reuse else None
        reused = dialogue is not None
        if dialogue is None:
            dialogue = await self._connect()
        keep = False
        if progress is not None:
            progress.began = True  # MAIL FROM goes next, without another wait
        try:
            delivery = await self._transact(dialogue, sender, recipients, message,
                                            reused=reused)
            keep = True
            return delivery
        except SmtpError as exc:
            # Lost or timed out once the message had gone: the server may have taken it.
            lost = dialogue.message_pending and exc.reply is None
            # The server replied, so the dialogue can be brought back in step and reused;
            # reset says when it cannot (lost, timed out, or mid-DATA).
            keep = dialogue.is_connected and await dialogue.reset()
            if lost:
                raise SmtpAnswerLost(
                    f"{exc}, after the message was handed over: whether the server accepted "
                    "it is not known", stage=exc.stage, refused=exc.refused) from exc
            raise
        finally:
            # Also reached on cancellation (keep is False): a half-done dialogue is discarded.
            if keep and not self._closed:
                self._idle.append(dialogue)
            else:
                dialogue.close()

    def _take_idle(self) -> Dialogue | None:
        while self._idle:
            dialogue = self._idle.pop()
            if dialogue.is_idle:
                return dialogue
            dialogue.close()
        return None

    async def _connect(self) -> Dialogue:
        cfg = self.config
        if self._local_hostname is None:
            self._local_hostname = await asyncio.to_thread(socket.getfqdn)
        smtp = aiosmtplib.SMTP(
            hostname=cfg.host, port=cfg.port, timeout=cfg.timeout_secs,
            use_tls=cfg.security == "tls", start_tls=False, tls_context=self._tls,
            local_hostname=self._local_hostname,
        )
        try:
            await step("connect", smtp.connect())
            ehlo_refused = await greet(smtp)
            if ehlo_refused is not None:
                check_plain_session(cfg.security, cfg.username, ehlo_refused)
            if cfg.security == "starttls":
                # Required, not opportunistic: never fall back to plain text.
                if not smtp.supports_extension("starttls"):
                    raise SmtpTransient("tls: the server does not offer STARTTLS", stage="tls")
                await step("tls", smtp.starttls())
                await step("tls", smtp.ehlo())
            if cfg.username is not None:
                secret = cfg.password.get_secret_value() if cfg.password else ""
                await step("auth", smtp.login(cfg.username, secret))
            try:
                dialogue = Dialogue.take_over(smtp, timeout_secs=cfg.timeout_secs,
                                              chunking=cfg.chunking)
            except aiosmtplib.SMTPException as exc:  # lost right after the setup
                raise classify(exc, "connect") from exc
        except BaseException as exc:
            smtp.close()
            if isinstance(exc, SmtpError):
                level = logging.ERROR if isinstance(exc, SmtpConfigError) else logging.WARNING
                event("postrelay.smtp.connect_failed", level, host=cfg.host, port=cfg.port,
                      stage=exc.stage, error=str(exc))
            raise
        self.connections_opened += 1
        event("postrelay.smtp.connected", logging.DEBUG, host=cfg.host, port=cfg.port,
              security=cfg.security, esmtp=ehlo_refused is None,
              pipelining=dialogue.pipelining, chunking=dialogue.chunking,
              open=self.connections_opened)
        return dialogue

    async def _transact(
        self, dialogue: Dialogue, sender: str, recipients: Sequence[str], message: bytes,
        *, reused: bool,
    ) -> Delivery:
        """MAIL, RCPT, DATA and the message. Pipelined, the first three go in one write and
        their replies are read in order; otherwise each command waits for the reply before
        it. The message itself goes only after a 354, so a send that fails before that
        never reached the server's queue; except with CHUNKING, where it goes in the same
        write as one BDAT chunk, which a server refuses with the transaction when MAIL or
        every RCPT was refused (the reply is read by `reset`). A reused connection found
        closed is retried on a fresh one only when the message cannot have gone: it went
        with DATA, or the server's 421 refused it."""
        check_size(dialogue, message)
        utf8 = needs_smtputf8(dialogue, sender, recipients)
        if not dialogue.eightbitmime and not message.isascii():
            # Sent as it is, its 8-bit bytes may be cut to 7 on the way (RFC 6152).
            raise SmtpPermanent("mail: the message has 8-bit bytes, which need 8BITMIME, "
                                "which the server lacks", stage="mail")
        parameters = b" SMTPUTF8" if utf8 else b""
        mail = b"MAIL FROM:" + envelope_address(sender, utf8=utf8) + parameters
        rcpts = [b"RCPT TO:" + envelope_address(r, utf8=utf8) for r in recipients]
        ahead = dialogue.pipelining
        chunked = dialogue.chunking
        try:
            if chunked:
                dialogue.write_chunked(mail, *rcpts, message=message)
            else:
                dialogue.write(*([mail, *rcpts, b"DATA"] if ahead else [mail]))
            mail_reply = await step("mail", dialogue.read())
            if mail_reply.code != _OK and not 200 <= mail_reply.code < 300:
                raise not_positive(dialogue, mail_reply, "mail")
        except SmtpTransient as exc:
            # The server closed the idle connection (or said 421 while closing it) while it
            # sat in the pool: not a verdict on this message. But a message sent as BDAT
            # with no reply at all may have been taken: not sent again here.
            closed = isinstance(exc.__cause__, ConnectionError) and not chunked
            if reused and (closed or isinstance(exc, SmtpThrottled)):
                raise _StaleConnection from exc
            raise
        accepted: list[str] = []
        refused: dict[str, Reply] = {}
        stop: SmtpError | None = None  # a throttle or auth refusal, with CHUNKING
        for rcpt, command in zip(recipients, rcpts, strict=True):
            if not ahead:
                dialogue.write(command)
            response = await final_read(dialogue, "rcpt", refused, stop)
            if 200 <= response.code < 300:
                accepted.append(rcpt)
                continue
            if not 400 <= response.code < 600:  # no verdict on the recipient: out of step
                raise not_positive(dialogue, response, "rcpt", refused)
            refused[rcpt] = Reply.parse(response.code, response.message)
            error = classify(aiosmtplib.SMTPRecipientRefused(
                response.code, response.message, rcpt), "rcpt", refused)
            if isinstance(error, SmtpThrottled | SmtpAuthFailed):
                if not chunked:
                    raise error  # back off now rather than try each recipient
                # The message is already sent: the server may take it for those accepted.
                stop = stop or error
        if not accepted:
            if stop is not None:
                raise stop
            last = list(refused.values())[-1]
            kind = SmtpPermanent if all(r.code >= 500 for r in refused.values()) else SmtpTransient
            raise kind(f"rcpt: every recipient refused (last: {last})", stage="rcpt",
                       reply=last, refused=refused)
        if not chunked:
            if not ahead:
                dialogue.write(b"DATA")
            start = await step("data", dialogue.read(), refused)
            if start.code != _START_INPUT:
                raise not_positive(dialogue, start, "data", refused)
            # From here the server may hold the message: never retried here.
            dialogue.write_message(message)
        response = await final_read(dialogue, "data", refused, stop)
        if response.code != _OK and not 200 <= response.code < 300:
            raise not_positive(dialogue, response, "data", refused, message_went=True)
        if stop is not None:
            self._react(stop)  # sent to some; the rest wait out the throttle or the pause
        self.messages_sent += 1
        reply = Reply.parse(response.code, response.message)
        return Delivery(tuple(accepted), MappingProxyType(refused), reply,
                        queue_id_from(reply.text))

    def _check_can_send(self) -> None:
        if self._closed:
            raise PostrelayError("the SMTP pool is closed")
        remaining = self.paused_for()
        if remaining > 0:
            event("postrelay.smtp.paused", logging.DEBUG, host=self.config.host,
                  remaining_secs=round(remaining, 3))
            raise SmtpPaused(remaining)

    async def _wait_out_throttle(self) -> None:
        while (delay := self._throttled_until - self._clock()) > 0:
            until = self._throttled_until
            event("postrelay.smtp.throttle_wait", logging.DEBUG, wait_secs=round(delay, 3))
            await asyncio.sleep(delay)
            if self._throttled_until == until:  # not throttled again meanwhile
                break

    def _react(self, exc: SmtpError) -> None:
        cfg, now = self.config, self._clock()
        code = exc.reply.code if exc.reply else None
        if isinstance(exc, SmtpThrottled):
            self._throttled_until = max(self._throttled_until, now + cfg.throttle_secs)
            event("postrelay.smtp.throttled", logging.WARNING, host=cfg.host, stage=exc.stage,
                  code=code, wait_secs=cfg.throttle_secs)
        elif isinstance(exc, SmtpAuthFailed):
            self._paused_until = now + cfg.auth_pause_secs
            event("postrelay.smtp.auth_paused", logging.ERROR, host=cfg.host,
                  username=cfg.username, code=code, pause_secs=cfg.auth_pause_secs)


def _check_addresses(sender: str, recipients: Sequence[str]) -> None:
    if not recipients:
        raise ValidationError("recipients", "at least one is required")
    for name, value in (("sender", sender), *(("recipients", r) for r in recipients)):
        if any(ch in value for ch in "\r\n\0"):
            raise ValidationError(name, "no CR, LF or NUL in an address")


def _tls_context(config: SmtpConfig) -> ssl.SSLContext | None:
    if config.security == "none":
        return None
    cafile = str(config.ca_file) if config.ca_file else None
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    except (OSError, ssl.SSLError) as exc:  # a missing file, or one that holds no certificate
        raise ConfigError(f"POSTRELAY_SMTP_CA_FILE: cannot read {cafile}: {exc}") from None
    if not config.validate_certs:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
