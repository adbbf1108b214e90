"""A real SMTP server (aiosmtpd) that answers by script: for tests and the embedded demo.

    handler = ScriptedHandler({"nobody@*": reply("550 5.1.1 No such user"),
                               "*@slow.example": slow(2.0)})
    with SmtpSink(handler, maildir=Path("demo-mail")) as sink:
        ...  # send to sink.host:sink.port
        handler.count_for("ann@acme.example")

Rules are glob patterns on the lower-cased recipient address, first match wins; a recipient
no rule matches is accepted. Accepted messages are kept in memory (and in a Maildir if given).
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import hmac
import mailbox
import re
import socket
import ssl
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from email.message import EmailMessage
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session


@dataclass(frozen=True)
class Accept:
    pass


@dataclass(frozen=True)
class ReplyAtRcpt:
    status: str  # "550 5.1.1 No such user"


@dataclass(frozen=True)
class ReplyAtData:
    status: str


@dataclass(frozen=True)
class DropAfterData:
    pass


@dataclass(frozen=True)
class Slow:
    secs: float
    then: Behaviour


Behaviour = Accept | ReplyAtRcpt | ReplyAtData | DropAfterData | Slow


def accept() -> Behaviour:
    """Accept the recipient and the message."""
    return Accept()


def reply(status: str) -> Behaviour:
    """Refuse the recipient at RCPT with `status`, e.g. "450 4.2.0 Mailbox busy"."""
    return ReplyAtRcpt(_checked(status))


def reply_at_data(status: str) -> Behaviour:
    """Accept the recipient, then refuse the whole message at the end of DATA."""
    return ReplyAtData(_checked(status))


def drop_after_data() -> Behaviour:
    """Keep the message, then drop the connection without replying: the client never learns
    that it was accepted (the crash window a sender must survive)."""
    return DropAfterData()


def slow(secs: float, then: Behaviour | None = None) -> Behaviour:
    """Wait `secs` before the RCPT reply, then behave as `then` (default: accept)."""
    return Slow(secs, then or Accept())


def _checked(status: str) -> str:
    if not re.match(r"[45]\d\d(?:[ -]|$)", status):  # "-": a multi-line reply
        raise ValueError(f"an SMTP refusal starts with a 4xx or 5xx code, got {status!r}")
    return status


@dataclass(frozen=True)
class Received:
    """One accepted message, as the server saw it."""

    sender: str
    recipients: tuple[str, ...]
    raw: bytes
    message: EmailMessage
    queue_id: str
    at: float  # time.monotonic() when it was stored
    tls: bool
    login: str | None  # the AUTH user of the session, if any


@dataclass(frozen=True)
class Refusal:
    """A scripted refusal the server sent (`stage` "rcpt" or "data") and when."""

    stage: Literal["rcpt", "data"]
    recipients: tuple[str, ...]
    status: str
    at: float


class ScriptedHandler:
    """aiosmtpd handler answering per recipient by `rules`; keeps what it accepted.

    The hooks run in the server's thread, readers in the test's: lists are lock-guarded.
    """

    def __init__(
        self,
        rules: Mapping[str, Behaviour] | Iterable[tuple[str, Behaviour]] = (),
        *,
        maildir: Path | None = None,
    ) -> None:
        pairs = rules.items() if isinstance(rules, Mapping) else rules
        self.rules = [(pattern.lower(), behaviour) for pattern, behaviour in pairs]
        self.maildir = maildir
        self._lock = threading.Lock()
        self._received: list[Received] = []
        self._refusals: list[Refusal] = []
        self._refuse_next: list[str] = []
        self.pipelining = True  # offered in the reply to EHLO (SmtpSink sets it)

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    @property
    def refusals(self) -> list[Refusal]:
        with self._lock:
            return list(self._refusals)

    def count_for(self, address: str) -> int:
        """How many accepted messages had `address` among their envelope recipients."""
        wanted = address.lower()
        return sum(wanted in (r.lower() for r in m.recipients) for m in self.received)

    def refuse_next(self, status: str, count: int = 1) -> None:
        """Refuse the next `count` recipients at RCPT with `status`, whoever they are and
        ahead of the rules: a server that throttles its clients on demand, such as
        `refuse_next("454 4.7.0 Too many messages, slow down")`."""
        checked = _checked(status)
        with self._lock:
            self._refuse_next.extend([checked] * count)

    def clear(self) -> None:
        with self._lock:
            self._received.clear()
            self._refusals.clear()

    def behaviour_for(self, address: str) -> Behaviour:
        lowered = address.lower()
        for pattern, behaviour in self.rules:
            if fnmatchcase(lowered, pattern):
                return behaviour
        return Accept()

    async def handle_EHLO(  # noqa: N802 - aiosmtpd's hook name
        self, server: SMTP, session: Session, envelope: Envelope, hostname: str,
        responses: list[str],
    ) -> list[str]:
        session.host_name = hostname  # this hook's duty (aiosmtpd's own EHLO leaves it)
        if self.pipelining:  # aiosmtpd reads commands in order, so it can: Postfix offers it
            responses.insert(-1, "250-PIPELINING")
        return responses

    async def handle_RCPT(  # noqa: N802 - aiosmtpd's hook name
        self, server: SMTP, session: Session, envelope: Envelope, address: str,
        rcpt_options: list[str],
    ) -> str:
        with self._lock:
            refusal = self._refuse_next.pop(0) if self._refuse_next else None
        if refusal is not None:
            self._note(Refusal("rcpt", (address,), refusal, time.monotonic()))
            return refusal
        behaviour = self.behaviour_for(address)
        while isinstance(behaviour, Slow):
            await asyncio.sleep(behaviour.secs)  # cancelled if the client hangs up first
            behaviour = behaviour.then
        if isinstance(behaviour, ReplyAtRcpt):
            self._note(Refusal("rcpt", (address,), behaviour.status, time.monotonic()))
            return behaviour.status
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 2.1.5 OK"

    async def handle_DATA(  # noqa: N802 - aiosmtpd's hook name
        self, server: SMTP, session: Session, envelope: Envelope
    ) -> str:
        plans = [_at_data(self.behaviour_for(r)) for r in envelope.rcpt_tos]
        refusal = next((p for p in plans if isinstance(p, ReplyAtData)), None)
        if refusal is not None:
            self._note(Refusal("data", tuple(envelope.rcpt_tos), refusal.status,
                               time.monotonic()))
            return refusal.status
        stored = self._store(server, session, envelope)
        if any(isinstance(p, DropAfterData) for p in plans) and server.transport is not None:
            server.transport.close()
            # Closing cancels this session's task; wait for that rather than reply.
            await asyncio.get_running_loop().create_future()
        return f"250 2.0.0 Ok: queued as {stored.queue_id}"

    def _store(self, server: SMTP, session: Session, envelope: Envelope) -> Received:
        raw = envelope.original_content or b""
        auth = session.auth_data  # what the authenticator returned: the LoginPassword
        login = auth.login if isinstance(auth, LoginPassword) else None
        received = Received(
            sender=envelope.mail_from or "",
            recipients=tuple(envelope.rcpt_tos),
            raw=raw,
            message=email.message_from_bytes(raw, policy=email.policy.default),
            queue_id=uuid.uuid4().hex[:12].upper(),
            at=time.monotonic(),
            tls=server.transport is not None
            and server.transport.get_extra_info("sslcontext") is not None,
            login=login.decode(errors="replace") if isinstance(login, bytes) else login,
        )
        if self.maildir is not None:
            self.maildir.parent.mkdir(parents=True, exist_ok=True)
            mailbox.Maildir(self.maildir, create=True).add(raw)
        with self._lock:
            self._received.append(received)
        return received

    def _note(self, refusal: Refusal) -> None:
        with self._lock:
            self._refusals.append(refusal)


def _at_data(behaviour: Behaviour) -> Behaviour:
    while isinstance(behaviour, Slow):  # slowness applies to RCPT only
        behaviour = behaviour.then
    return behaviour


class SmtpSink:
    """An aiosmtpd server on 127.0.0.1 (a free port) in its own thread.

    `tls_context` offers STARTTLS (`require_starttls` refuses mail without it); `ssl_context`
    serves implicit TLS instead. `auth` (user -> password) requires AUTH; the dict is kept as
    `credentials` and read at each attempt, so a test may change it while the sink runs.
    `connections` counts the SMTP sessions opened by clients. `pipelining=False` leaves
    PIPELINING out of the EHLO reply, so that clients wait for each reply. `server_class`
    runs each session on a subclass of aiosmtpd's `SMTP` (one that misbehaves, say).
    """

    host = "127.0.0.1"

    def __init__(
        self,
        handler: ScriptedHandler | None = None,
        *,
        tls_context: ssl.SSLContext | None = None,
        require_starttls: bool = False,
        ssl_context: ssl.SSLContext | None = None,
        auth: Mapping[str, str] | None = None,
        auth_require_tls: bool = True,
        maildir: Path | None = None,
        idle_timeout_secs: float = 300.0,
        pipelining: bool = True,
        server_class: type[SMTP] = SMTP,
    ) -> None:
        self.handler = handler or ScriptedHandler()
        self.server_class = server_class
        self.handler.pipelining = pipelining
        if maildir is not None:
            self.handler.maildir = maildir
        self.credentials: dict[str, str] = dict(auth or {})
        self.port = 0
        self.connections = 0
        self._options: dict[str, Any] = {
            "tls_context": tls_context, "require_starttls": require_starttls,
            "timeout": idle_timeout_secs, "server_hostname": "postrelay-sink",
            "ssl_context": ssl_context,
        }
        if auth is not None:
            # aiosmtpd counts only STARTTLS as TLS; an implicit-TLS session is encrypted too.
            self._options.update(authenticator=self._authenticate, auth_required=True,
                                 auth_require_tls=auth_require_tls and ssl_context is None)
        self._sessions: weakref.WeakSet[SMTP] = weakref.WeakSet()
        self._controller: _Controller | None = None
        self._ready = False

    def __enter__(self) -> SmtpSink:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> SmtpSink:
        for attempt in range(3):  # the free port may be taken between probe and bind
            self.port = _free_port(self.host)
            controller = _Controller(self, self.handler, hostname=self.host, port=self.port,
                                     **self._options)
            try:
                controller.start()
            except OSError:
                if attempt == 2:
                    raise
                continue
            self._controller, self._ready = controller, True
            return self
        raise AssertionError("unreachable")

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller, self._ready = None, False

    def close_sessions(self) -> int:
        """Close every open client connection from the server side; returns how many."""
        return self._on_server_loop(self._close_all)

    def open_sessions(self) -> int:
        """How many client connections are open right now."""
        return self._on_server_loop(self._count_open)

    async def _close_all(self) -> int:
        open_ = [s for s in self._sessions if s.transport is not None]
        for session in open_:
            session.transport.close()  # type: ignore[union-attr]
        await asyncio.sleep(0)  # let the transports finish closing their sockets
        return len(open_)

    async def _count_open(self) -> int:
        return sum(s.transport is not None for s in self._sessions)

    def _on_server_loop(self, coro_fn: Callable[[], Coroutine[Any, Any, int]]) -> int:
        if self._controller is None:
            return 0
        return asyncio.run_coroutine_threadsafe(coro_fn(), self._controller.loop).result(5)

    def _opened(self, session: SMTP) -> None:
        if self._ready:  # before that, only the controller's own readiness probe connects
            self.connections += 1
            self._sessions.add(session)

    def _authenticate(self, server: SMTP, session: Session, envelope: Envelope,
                      mechanism: str, auth_data: Any) -> AuthResult:
        if isinstance(auth_data, LoginPassword):
            expected = self.credentials.get(auth_data.login.decode(errors="replace"))
            if expected is not None and hmac.compare_digest(expected.encode(),
                                                            auth_data.password):
                return AuthResult(success=True, auth_data=auth_data)
        return AuthResult(success=False, handled=False)


class _Controller(Controller):
    """aiosmtpd's threaded controller, telling the sink about each new session."""

    def __init__(self, sink: SmtpSink, handler: ScriptedHandler, **kwargs: Any) -> None:
        self._sink = sink
        super().__init__(handler, **kwargs)

    def factory(self) -> SMTP:
        session = self._sink.server_class(self.handler, **self.SMTP_kwargs)
        self._sink._opened(session)  # runs on the server's thread, one call per connection
        return session


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port
