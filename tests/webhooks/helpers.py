"""Small builders shared by the webhook tests."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.queue import Job
from postrelay.queue.effects import collecting, effect_statements
from postrelay.relay import emit
from postrelay.relay.webhooks import webhook_add


def add_endpoint(engine: Engine, tenant: uuid.UUID, url: str,
                 event_types: list[str] | None = None) -> tuple[uuid.UUID, str]:
    with engine.begin() as conn:
        # The receivers of these tests listen on loopback.
        endpoint, secret = webhook_add(conn, tenant, url, event_types=event_types,
                                       allow_private=True)
    return endpoint.id, secret


def emit_event(engine: Engine, tenant: uuid.UUID, event_type: str = "order.placed",
               payload: dict[str, Any] | None = None) -> uuid.UUID:
    with engine.begin() as conn:
        return emit(conn, event_type, payload or {"order": 42, "total": "9.90"},  # type: ignore[return-value]
                    tenant_id=tenant, aggregate_type="order", aggregate_id="42")


def dispatch_job(tenant: uuid.UUID, event_id: uuid.UUID, endpoint_id: uuid.UUID,
                 attempts: int = 1) -> Job:
    """A claimed outbox_dispatch job as the worker would hand it to the handler."""
    now = datetime.now(UTC)
    payload = {"channel": "webhook", "event_id": str(event_id), "endpoint_id": str(endpoint_id)}
    return Job(uuid.uuid4(), tenant, "outbox_dispatch", payload, 100, attempts, 8, now, now,
               now, None)


def as_worker_runs(handler: Callable[[Job], Awaitable[Any]],
                   async_engine: AsyncEngine) -> Callable[[Job], Awaitable[Any]]:
    """`handler` run as the worker runs it: what it records with its outcome (the attempt's
    row) is written once it has returned or raised, in a transaction of its own."""
    async def run(job: Job) -> Any:
        with collecting() as effects:
            try:
                return await handler(job)
            finally:
                async with async_engine.begin() as conn:
                    for statement, params in effect_statements(effects):
                        await conn.execute(statement, params)
    return run


def attempts_of(engine: Engine, endpoint_id: uuid.UUID) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT job_id, event_id, attempt, status_code, duration_ms, response_body, error "
            "FROM mdm.aa_webhook_attempt WHERE endpoint_id = :e ORDER BY id"),
            {"e": endpoint_id}).mappings().all()
    return [dict(r) for r in rows]


def endpoint_state(engine: Engine, endpoint_id: uuid.UUID) -> tuple[bool, str | None]:
    with engine.connect() as conn:
        row = conn.execute(text("SELECT enabled, disabled_reason FROM mdm.aa_webhook_endpoint "
                                "WHERE id = :e"), {"e": endpoint_id}).one()
    return row[0], row[1]


def ticking_clock(start: float | None = None) -> Any:
    """A clock that moves one second per reading: every attempt gets a new timestamp
    without the test sleeping."""
    ticks = itertools.count()
    base = time.time() if start is None else start
    return lambda: base + next(ticks)
