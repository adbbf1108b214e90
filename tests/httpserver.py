"""A real HTTP server on a thread of the test process, for the stand-ins some tests need
(a proxy in front of the API, the host SNS fetches its certificate from)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer


@contextmanager
def serving(server: ThreadingHTTPServer, scheme: str = "http") -> Iterator[str]:
    """Serve `server` on a daemon thread until the block ends; yields its base URL."""
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
