"""The demo's background jobs: several kinds, some fail and retry, one ends in the DLQ."""

from __future__ import annotations

import asyncio
from uuid import UUID

from postrelay.queue import Job, JobSpec, Registry


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
