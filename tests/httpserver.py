"""A real HTTP server on a thread of the test process, for the stand-ins some tests need
(a proxy in front of the API, the host SNS fetches its certificate from), over HTTPS too."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import trustme


@contextmanager
def serving(server: ThreadingHTTPServer, scheme: str = "http") -> Iterator[str]:
    """Serve `server` on a daemon thread until the block ends; yields its base URL."""
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    try:
        yield f"{scheme}://{host}:{port}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def serving_https(handler: type[BaseHTTPRequestHandler], ca: trustme.CA,
                  *hosts: str, bind: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """`handler` over HTTPS on `bind`:`port` (any free port unless given), its certificate
    issued by `ca` for `hosts` (127.0.0.1 unless given), until the block ends; yields its
    base URL. A request still being answered (a body that never ends) does not hold the
    block's end."""
    server = ThreadingHTTPServer((bind, port), handler)
    server.daemon_threads = True
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*(hosts or ("127.0.0.1",))).configure_cert(context)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    with serving(server, "https") as url:
        yield url
