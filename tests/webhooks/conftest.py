"""Webhook fixtures: a loopback receiver, the webhook tables emptied per test, and names
that resolve as a test says."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

from tests.webhooks.receiver import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def wh_tenant(engine: Engine, tenant: uuid.UUID) -> uuid.UUID:
    """`tenant`, with the webhook tables emptied (clean_db knows only the core tables)."""
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE mdm.aa_webhook_endpoint, mdm.aa_webhook_attempt"))
    return tenant


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Host names the event loop resolves to the IPv4 addresses a test puts here (and may
    change between deliveries, as a DNS answer would); every other name as usual. The
    address guard resolves through the loop, so it sees these answers."""
    answers: dict[str, list[str]] = {}
    real = asyncio.BaseEventLoop.getaddrinfo

    async def getaddrinfo(self: asyncio.BaseEventLoop, host: Any, port: Any,
                          *args: Any, **kwargs: Any) -> Any:
        if host in answers:
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                     (address, int(port))) for address in answers[host]]
        return await real(self, host, port, *args, **kwargs)

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", getaddrinfo)
    return answers
