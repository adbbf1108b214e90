"""Webhook fixtures: a loopback receiver, and the webhook tables emptied per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

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
