"""Handlers for the flow-control tests: each run writes a row to `public.flow_run` (the
test creates it) with the database's clock at its start and its end, so that a test reads
what ran, when and where from one table, whichever process ran it.

Kinds `reindex`, `bulk_import` and `virus_scan`; payload `{"sleep": seconds}` (default 0).
"""

from __future__ import annotations

import asyncio
import os

import psycopg

from postrelay.core.db import libpq_url
from postrelay.queue import Job, handler

_conn: psycopg.AsyncConnection | None = None
_lock = asyncio.Lock()


async def _record(sql: str, params: tuple) -> None:
    global _conn
    async with _lock:  # one connection per process, one statement at a time
        if _conn is None or _conn.closed:
            _conn = await psycopg.AsyncConnection.connect(
                libpq_url(os.environ["POSTRELAY_DATABASE_URL"]), autocommit=True)
        await _conn.execute(sql, params)


async def run(job: Job) -> None:
    await _record(
        "INSERT INTO public.flow_run (job_id, attempt, kind, tenant_id, pid, started_at) "
        "VALUES (%s, %s, %s, %s, %s, clock_timestamp())",
        (job.id, job.attempts, job.kind, job.tenant_id, os.getpid()))
    await asyncio.sleep(float(job.payload.get("sleep", 0)))
    await _record(
        "UPDATE public.flow_run SET ended_at = clock_timestamp() "
        "WHERE job_id = %s AND attempt = %s", (job.id, job.attempts))


for _kind in ("reindex", "bulk_import", "virus_scan"):
    handler(_kind)(run)
