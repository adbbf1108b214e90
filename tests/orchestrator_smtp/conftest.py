"""Fixtures for the SMTP transport tests: a trustme CA, sinks on loopback, pools closed after
each test, and a clock the test moves by hand."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
import trustme

from postrelay.orchestrator.sink import Behaviour, ScriptedHandler, SmtpSink
from postrelay.orchestrator.transport import SmtpConfig, SmtpPool

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


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("smtp-ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


@pytest.fixture(scope="session")
def server_tls(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    return context


@pytest.fixture
def make_sink() -> Iterator[Callable[..., SmtpSink]]:
    sinks: list[SmtpSink] = []

    def make(rules: dict[str, Behaviour] | None = None, **options: Any) -> SmtpSink:
        sink = SmtpSink(ScriptedHandler(rules or {}), **options).start()
        sinks.append(sink)
        return sink

    yield make
    for sink in sinks:
        sink.stop()


@pytest.fixture
async def make_pool() -> AsyncIterator[Callable[..., SmtpPool]]:
    pools: list[SmtpPool] = []

    def make(sink: SmtpSink, *, clock: Callable[[], float] | None = None,
             **overrides: Any) -> SmtpPool:
        settings: dict[str, Any] = {"timeout_secs": 5.0, "pool_size": 1,
                                    "throttle_secs": 0.3, "auth_pause_secs": 30.0}
        config = SmtpConfig(host=sink.host, port=sink.port, **{**settings, **overrides})
        pool = SmtpPool(config, clock=clock) if clock else SmtpPool(config)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        await pool.close()
