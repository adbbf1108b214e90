"""`postrelay demo`: the whole queue on embedded defaults, in one command.

Migrates the database (the embedded PostgreSQL unless POSTRELAY_DATABASE_URL is set),
enqueues sample jobs of several kinds — some fail and retry, one ends in the DLQ — runs a
worker until they have all settled, and prints what happened.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from uuid import UUID

from sqlalchemy import Engine

from postrelay.core.db import Database
from postrelay.core.migrate import upgrade
from postrelay.core.settings import Settings
from postrelay.queue import JobSpec, Registry, enqueue_many, ensure_tenant
from postrelay.queue.admin import QueueStatus, dlq_list, job_list, queue_status
from postrelay.queue.model import Job
from postrelay.runtime import build_worker

SETTLED_POLL_SECS = 0.1


def demo_registry() -> Registry:
    registry = Registry()

    @registry.handler("reindex")
    async def reindex(job: Job) -> None:
        await asyncio.sleep(0.01)

    @registry.handler("bulk_import")
    async def bulk_import(job: Job) -> None:
        # A flaky upstream: the first attempts fail, a later one succeeds.
        if job.attempts <= job.payload["fails"]:
            raise ConnectionError(f"upstream timed out (attempt {job.attempts})")

    @registry.handler("virus_scan")
    async def virus_scan(job: Job) -> None:
        raise RuntimeError(f"signature database unavailable for {job.payload['file']}")

    return registry


def sample_jobs(tenant: UUID) -> list[JobSpec]:
    jobs = [JobSpec("reindex", {"document": n}, tenant) for n in range(20)]
    jobs += [JobSpec("bulk_import", {"batch": n, "fails": n % 3}, tenant) for n in range(6)]
    jobs.append(JobSpec("virus_scan", {"file": "invoice-2026-11.pdf"}, tenant, max_attempts=3))
    return jobs


def run_demo(settings: Settings, db: Database, echo=print) -> QueueStatus:  # noqa: ANN001
    started = time.perf_counter()
    upgrade(db.url)
    engine = db.sync_engine()
    with engine.begin() as conn:
        tenant = ensure_tenant(conn, f"demo-{datetime.now(UTC):%Y%m%dT%H%M%S.%f}")
        ids = enqueue_many(conn, sample_jobs(tenant), created_by="postrelay.demo")
    echo(f"database: {_where(settings, db)}")
    echo(f"enqueued {len(ids)} jobs for tenant {tenant}; running a worker until they settle…")
    # Short retry delay so the demo finishes in seconds; production uses the settings.
    demo_settings = settings.model_copy(update={"job_retry_delay_secs": 0.2})
    logging.getLogger("postrelay").setLevel(logging.ERROR)  # the summary below says it all
    asyncio.run(_work_until_settled(demo_settings, db, engine, tenant))
    with engine.connect() as conn:
        status = queue_status(conn, tenant_id=tenant)
        dead = dlq_list(conn, tenant_id=tenant)
        retried = [j for j in job_list(conn, tenant_id=tenant, status="done", limit=500)
                   if j.attempts > 1]
    echo(f"\nsettled in {time.perf_counter() - started:.1f} s")
    echo("jobs by status: " + ", ".join(f"{s}={n}" for s, n in status.by_status.items()))
    for kind, counts in sorted(status.by_kind.items()):
        echo(f"  {kind:<12} " + ", ".join(f"{s}={n}" for s, n in counts.items() if n))
    echo(f"{len(retried)} jobs failed at first and succeeded on a retry: "
         + ", ".join(f"{j.kind} after {j.attempts} attempts" for j in retried))
    echo(f"\ndead-letter queue ({len(dead)}):")
    for job in dead:
        last_line = (job.last_error or "").strip().splitlines()[-1:]
        echo(f"  {job.id} {job.kind} attempts={job.attempts}/{job.max_attempts}")
        echo(f"    last error: {last_line[0] if last_line else '-'}")
    echo("\nnext: `postrelay dlq list`, `postrelay dlq retry ID`, `postrelay status`")
    engine.dispose()
    return status


async def _work_until_settled(
    settings: Settings, db: Database, engine: Engine, tenant: UUID
) -> None:
    process = build_worker(settings, db, registry=demo_registry(), concurrency=8,
                           tenants=(tenant,), maintenance=False)
    await process.start()
    try:
        while True:
            with engine.connect() as conn:
                counts = queue_status(conn, tenant_id=tenant).by_status
            if counts["pending"] == 0 and counts["running"] == 0:
                return
            await asyncio.sleep(SETTLED_POLL_SECS)
    finally:
        await process.stop()


def _where(settings: Settings, db: Database) -> str:
    if db.embedded is not None:
        return f"embedded PostgreSQL in {settings.embedded_data_dir}"
    return db.url.render_as_string(hide_password=True)
