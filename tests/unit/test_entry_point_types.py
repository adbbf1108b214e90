"""A type checker sees a forgotten `await` and the deprecated old form: the async entry points
are coroutines (mypy's `unused-coroutine`), and the sync ones' overload for an async
connection is marked deprecated (mypy's `deprecated` code, a strike-through in pyright)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from mypy import api

SNIPPET = """
from uuid import UUID

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

import postrelay.queue as pq
import postrelay.relay as relay
from postrelay.orchestrator import EmailJob, enqueue_email_async


async def forgotten(conn: AsyncConnection, tenant: UUID, message: EmailJob) -> None:
    pq.enqueue_async(conn, "reindex", {}, tenant_id=tenant)  # line 13
    relay.emit_async(conn, "a.b", {}, tenant_id=tenant, aggregate_type="a", aggregate_id=1)
    enqueue_email_async(conn, message, tenant_id=tenant)


async def old_form(conn: AsyncConnection, tenant: UUID) -> UUID:
    return await pq.enqueue(conn, "reindex", {}, tenant_id=tenant)  # line 19


def sync(conn: Connection, tenant: UUID) -> list[UUID]:
    job_id: UUID = pq.enqueue(conn, "reindex", {}, tenant_id=tenant)
    return [job_id, *relay.emit_many(conn, [])]


async def awaited(conn: AsyncConnection, tenant: UUID) -> UUID:
    return await pq.enqueue_async(conn, "reindex", {}, tenant_id=tenant)
"""


def test_mypy_flags_a_forgotten_await_and_the_deprecated_form(tmp_path: Path) -> None:
    source = tmp_path / "caller.py"
    source.write_text(textwrap.dedent(SNIPPET))
    stdout, stderr, _ = api.run([
        "--strict", "--enable-error-code", "deprecated", "--follow-imports", "silent",
        "--cache-dir", str(tmp_path / "cache"), "--no-error-summary", str(source),
    ])
    errors = sorted(
        (int(line.split(":")[1]), line.rsplit("[", 1)[-1].rstrip("]"))
        for line in stdout.splitlines() if ": error: " in line
    )
    assert errors == [
        (13, "unused-coroutine"), (14, "unused-coroutine"), (15, "unused-coroutine"),
        (19, "deprecated"),
    ], stdout + stderr
