"""The email orchestrator's fixtures: an email rig (templates in a temporary folder, a
scripted aiosmtpd server on loopback, and a worker running the real `email_send` handler
against this run's database), and for the SMTP pool and sink tests a trustme CA, sinks on
loopback and pools closed after each test."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import text

from postrelay.orchestrator import (
    EMAIL_KIND,
    EmailJob,
    SmtpConfig,
    SmtpPool,
    Templates,
    enqueue_email,
)
from postrelay.orchestrator.handler import email_registry
from postrelay.queue import enqueue
from postrelay.queue.backoff import FixedBackoff
from postrelay.queue.registry import Registry
from postrelay.queue.worker import Worker, WorkerConfig
from postrelay.testing import Behaviour, ScriptedHandler, SmtpSink

SENDER = "Acme <noreply@acme.example>"


def write_template(root: Path, name: str, subject: str, body: str, html: str | None = None,
                   toml: str | None = None) -> None:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "subject.txt").write_text(subject)
    (folder / "body.txt").write_text(body)
    if html is not None:
        (folder / "body.html").write_text(html)
    if toml is not None:
        (folder / "template.toml").write_text(toml)


@pytest.fixture
def templates_dir(tmp_path: Path) -> Path:
    root = tmp_path / "templates"
    write_template(root, "welcome", "Welcome, {{ user.name }}!",
                   "Hello {{ user.name }}, welcome aboard.\n",
                   "<p>Hello <b>{{ user.name }}</b></p>")
    write_template(root, "invoice", "Invoice {{ number }}", "Invoice {{ number }} is due.\n",
                   toml='on_unknown = "hold"\n')
    return root


@pytest.fixture
def sink() -> Iterator[SmtpSink]:
    with SmtpSink(ScriptedHandler()) as running:
        yield running


class Rig:
    """Starts and stops workers sending through `sink`, and reads back what happened."""

    def __init__(self, engine, async_engine, libpq, sink: SmtpSink, templates: Path) -> None:
        self.engine = engine
        self.async_engine = async_engine
        self.libpq = libpq
        self.sink = sink
        self.templates = templates
        self.pool = SmtpPool(SmtpConfig(host=sink.host, port=sink.port, pool_size=4,
                                        timeout_secs=2.0, throttle_secs=0.05,
                                        auth_pause_secs=0.5))
        self.workers: list[tuple[Worker, Registry]] = []

    def enqueue(self, tenant: UUID, *, to: Any = ("ann@example.com",), template: str = "welcome",
                context: dict[str, Any] | None = None, max_attempts: int = 3,
                **fields: Any) -> UUID:
        message = EmailJob(template=template, to=tuple(to) if not isinstance(to, str) else (to,),
                           context=context or {"user": {"name": "Ann"}, "number": "I-1"},
                           sender=fields.pop("sender", SENDER), **fields)
        with self.engine.begin() as conn:
            return enqueue_email(conn, message, tenant_id=tenant, max_attempts=max_attempts)

    def enqueue_raw(self, tenant: UUID, *, to: list[str], template: str = "welcome") -> UUID:
        """As a relay route does: the payload goes in unchecked; the handler checks it."""
        payload = EmailJob(template=template, to=tuple(to), sender=SENDER,
                           context={"user": {"name": "Ann"}}).to_payload()
        with self.engine.begin() as conn:
            return enqueue(conn, EMAIL_KIND, payload, tenant_id=tenant, max_attempts=3)

    async def start(self, *, return_path: Any = None, unsubscribe: Any = None,
                    **config: Any) -> Worker:
        # reload_secs=0: tests fix template files and expect the very next run to see it.
        templates = Templates(self.templates, reload_secs=0)
        registry = email_registry(self.async_engine, templates, self.pool,
                                  message_id_domain="mail.acme.example",
                                  return_path=return_path, unsubscribe=unsubscribe)
        config.setdefault("poll_interval_secs", 0.1)
        config.setdefault("grace_secs", 1.0)
        worker = Worker(self.async_engine, WorkerConfig(**config), registry=registry,
                        backoff=FixedBackoff(0.05), listen_url=self.libpq)
        await worker.start()
        self.workers.append((worker, registry))
        return worker

    async def stop(self) -> None:
        for worker, registry in self.workers:
            await worker.stop()
            for close in registry.closers:
                await close()
        self.workers.clear()
        await self.pool.close()

    async def settle(self, *job_ids: UUID, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while any(self.job(j)["status"] in ("pending", "running") for j in job_ids):
            assert time.monotonic() < deadline, "jobs did not settle"
            await asyncio.sleep(0.02)

    def job(self, job_id: UUID) -> dict[str, Any]:
        with self.engine.connect() as conn:
            return dict(conn.execute(text(
                "SELECT status::text AS status, attempts, last_error FROM mdm.aa_job "
                "WHERE id = :id"), {"id": job_id}).mappings().one())

    def log(self, job_id: UUID | None = None) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(text(
                "SELECT * FROM mdm.aa_email_log WHERE CAST(:job AS uuid) IS NULL "
                "OR job_id = CAST(:job AS uuid) ORDER BY attempt, created_at"),
                {"job": str(job_id) if job_id else None}).mappings()]

    def suppressed(self, tenant: UUID) -> dict[str, str]:
        with self.engine.connect() as conn:
            return dict(conn.execute(text(
                "SELECT address, reason FROM mdm.aa_email_suppression WHERE tenant_id = :t"),
                {"t": tenant}).all())


@pytest.fixture
async def rig(engine, async_engine, libpq, sink, templates_dir, clean_db
              ) -> AsyncIterator[Rig]:
    running = Rig(engine, async_engine, libpq, sink, templates_dir)
    try:
        yield running
    finally:
        await running.stop()


async def eventually(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.02)


# The SMTP pool and sink tests.

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
