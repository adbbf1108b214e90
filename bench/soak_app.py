"""Handlers for the soak run (`bench/soak.py`), whose outcome each job's payload fixes in
advance, so that the run can check the end state job by job.

- `reindex` {"i": i}: sleeps up to 30 ms; i % 100 == 0 fails for good (straight to the
  DLQ); i % 20 == 1 fails its first attempt and succeeds on the retry; the rest succeed.
- `bulk_import`: runs up to three times the soak's 2 s lease, on a live worker whose
  heartbeats must keep it claimed.
- `index_sync`: does nothing; a cron entry fires it every second.
"""

import asyncio
import random

from postrelay.queue import Job, PermanentError, handler

SLOW_SECS = 6.0


def permanent(i: int) -> bool:
    return i % 100 == 0


def flaky(i: int) -> bool:
    return i % 20 == 1


@handler("reindex")
async def reindex(job: Job) -> None:
    await asyncio.sleep(random.random() * 0.03)
    i = job.payload["i"]
    if permanent(i):
        raise PermanentError(f"job {i} is bad input")
    if flaky(i) and job.attempts == 1:
        raise RuntimeError(f"job {i} fails its first attempt")


@handler("bulk_import")
async def slow(job: Job) -> None:
    await asyncio.sleep(random.random() * SLOW_SECS)


@handler("index_sync")
async def tick(job: Job) -> None:
    return None
