"""A real HTTP receiver on loopback that verifies Standard Webhooks signatures on its own.

The verifier below is written from the specification's text, not from postrelay's signing
code: the signed content is `{webhook-id}.{webhook-timestamp}.{body}`; the key is the
base64-decoded part of the secret after `whsec_`; the signature is HMAC-SHA256, base64
encoded, listed in `webhook-signature` as space-separated `v1,<sig>` entries; a timestamp
outside the tolerance is refused. `test_verifier_accepts_the_published_vector` checks it
against the spec's own example, so the two implementations cannot share a mistake.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE_SECS = 5 * 60  # the spec's suggested default


def verify_standard_webhook(secret: str, headers: dict[str, str], body: bytes,
                            now: float | None = None) -> bool:
    msg_id = headers.get("webhook-id")
    stamp = headers.get("webhook-timestamp")
    signatures = headers.get("webhook-signature")
    if not msg_id or not stamp or not signatures:
        return False
    try:
        sent_at = int(stamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - sent_at) > TOLERANCE_SECS:
        return False
    key_b64 = secret[len("whsec_"):] if secret.startswith("whsec_") else secret
    key = base64.b64decode(key_b64)
    to_sign = msg_id.encode() + b"." + stamp.encode() + b"." + body
    expected = base64.b64encode(hmac.new(key, to_sign, hashlib.sha256).digest()).decode()
    for entry in signatures.split(" "):
        version, _, value = entry.partition(",")
        if version == "v1" and hmac.compare_digest(value, expected):
            return True
    return False


@dataclass(frozen=True)
class Answer:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    delay_secs: float = 0.0
    drop: bool = False  # read the request, then close the connection without an answer


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    verified: bool
    received_at: float


class Receiver:
    """Answers POSTs with programmed answers, in order (then 200), after verifying each
    signature with `secret`; a bad signature is answered 401.

    HTTP/1.0 by default: the connection closes after each answer. With `keep_alive`,
    HTTP/1.1 with connections kept open, each closed by the receiver once idle for
    `idle_timeout_secs` (if given). `connections` counts the TCP connections it took,
    `closed` those it has closed."""

    def __init__(self, *, keep_alive: bool = False, idle_timeout_secs: float | None = None,
                 bind: str = "127.0.0.1", port: int = 0) -> None:
        self.secret: str | None = None
        self.answers: deque[Answer] = deque()
        self.requests: list[Received] = []
        self.keep_alive = keep_alive
        self.idle_timeout_secs = idle_timeout_secs
        self.connections = 0
        self.closed = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((bind, port), self.handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def program(self, *answers: Answer | int) -> None:
        with self._lock:
            self.answers.extend(a if isinstance(a, Answer) else Answer(a) for a in answers)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _next(self, request: Received) -> Answer:
        with self._lock:
            self.requests.append(request)
            if not request.verified:
                return Answer(401, body=b"bad signature")
            return self.answers.popleft() if self.answers else Answer()

    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        """The request handler, which also serves this receiver's answers over HTTPS
        (tests.httpserver.serving_https)."""
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if receiver.keep_alive else "HTTP/1.0"
            timeout = receiver.idle_timeout_secs  # a socket timeout: ends an idle connection

            def setup(self) -> None:
                super().setup()
                with receiver._lock:
                    receiver.connections += 1

            def finish(self) -> None:
                try:
                    super().finish()
                    # The FIN goes out before the close is counted, so that a test that
                    # waits for the count finds the client's side already readable.
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                with receiver._lock:
                    receiver.closed += 1

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                verified = receiver.secret is not None and verify_standard_webhook(
                    receiver.secret, headers, body)
                answer = receiver._next(
                    Received(self.path, headers, body, verified, time.time()))
                if answer.drop:
                    self.close_connection = True
                    return
                if answer.delay_secs:
                    time.sleep(answer.delay_secs)
                try:
                    self.send_response(answer.status)
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(answer.body)))
                    self.end_headers()
                    self.wfile.write(answer.body)
                except OSError:
                    pass  # the client gave up (timeout test)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        return Handler
