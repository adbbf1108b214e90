"""A `reindex` handler for jobs of any origin (enqueued, relayed from events, fired by
cron), reporting into the folder named by the worker's POSTRELAY_TEST_MARKS environment
variable, since relayed and cron jobs carry no folder in their payload.

Payload (all optional):
    fail_attempts     attempt numbers that raise, to be retried after the backoff
    hang_on_attempts  attempt numbers that never finish on their own

A run that starts creates `<marks>/started.<job id>.<attempt>.<pid>`; a run that succeeds
appends the job id to `<marks>/done.<pid>`.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from postrelay.queue import Job, handler


@handler("reindex")
async def anywhere(job: Job) -> None:
    folder = Path(os.environ["POSTRELAY_TEST_MARKS"])
    (folder / f"started.{job.id}.{job.attempts}.{os.getpid()}").touch()
    if job.attempts in job.payload.get("hang_on_attempts", ()):
        await asyncio.Event().wait()  # until the process is killed or stopped
    if job.attempts in job.payload.get("fail_attempts", ()):
        raise RuntimeError(f"attempt {job.attempts} fails on purpose")
    with open(folder / f"done.{os.getpid()}", "a") as out:
        out.write(f"{job.id}\n")
