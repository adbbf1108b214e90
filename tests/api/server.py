"""Serve an app with uvicorn on a free loopback port in a background thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from postrelay.core.db import Database, sqlalchemy_url
from postrelay.core.settings import Settings
from postrelay.web import create_web_app

# The suite's shared servers: its tests send many wrong keys from 127.0.0.1 within a minute,
# which the failed-authentication bound would turn into 429s. The bound itself is tested on
# servers of its own (tests/api/test_throttle.py).
UNTHROTTLED = {"auth_failures_per_client": 1_000_000, "auth_failures_total": 10_000_000}


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Run `app` until the block ends; yields its base URL."""
    # Port 0: the kernel picks a free port, read back from the bound socket below.
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                            lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def serve_database(database_url: str, service_key: str, **settings: object) -> Iterator[str]:
    """An app of its own on `database_url` (and any other `settings`), served; yields its
    base URL."""
    settings = Settings(database_url=database_url, service_role_key=service_key, **settings)
    db = Database(url=sqlalchemy_url(database_url))
    try:
        with serve(create_web_app(settings, db)) as url:
            yield url
    finally:
        db.close()
