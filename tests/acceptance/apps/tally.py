"""A `reindex` handler that only records which process ran which job: it appends the job
id to `<payload dir>/ran.<pid>`. Cheap enough for thousands of jobs."""

from __future__ import annotations

import os
from pathlib import Path

from postrelay.queue import Job, handler


@handler("reindex")
async def tally(job: Job) -> None:
    with open(Path(job.payload["dir"]) / f"ran.{os.getpid()}", "a") as out:
        out.write(f"{job.id}\n")
