"""A `reindex` handler that reports its progress through files, so a test can wait on
what a worker subprocess is doing instead of sleeping.

Payload:
    dir               folder to report into (required)
    sleep             seconds the run takes (default 0)
    hang_on_attempts  attempt numbers that never finish on their own (default none)
    exit_on_attempts  attempt numbers that call sys.exit(3) (default none)
    crash_on_attempts attempt numbers that call os._exit(3): the process dies at once
    ignore_cancel_on_attempts  attempt numbers that ignore their cancel and never end
    leak_task         the run leaves behind a task that ignores its cancel (default false)
    leak_thread       the run leaves behind a call in a thread that never returns

On start it creates `<dir>/started.<job id>.<attempt>.<pid>`; on finish it appends the
job id to `<dir>/finished.<pid>`; when its task is cancelled it creates
`<dir>/cancelled.<job id>.<pid>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from pathlib import Path

from postrelay.queue import Job, handler


async def stubborn() -> None:
    """Never ends, whatever cancel reaches it."""
    while True:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)


@handler("reindex")
async def step(job: Job) -> None:
    folder = Path(job.payload["dir"])
    (folder / f"started.{job.id}.{job.attempts}.{os.getpid()}").touch()
    if job.attempts in job.payload.get("exit_on_attempts", ()):
        sys.exit(3)
    if job.attempts in job.payload.get("crash_on_attempts", ()):
        os._exit(3)
    if job.attempts in job.payload.get("ignore_cancel_on_attempts", ()):
        await stubborn()
    if job.payload.get("leak_task"):
        asyncio.get_running_loop().create_task(stubborn(), name="leaked-by-a-handler")
    if job.payload.get("leak_thread"):
        asyncio.get_running_loop().run_in_executor(None, threading.Event().wait)
    try:
        if job.attempts in job.payload.get("hang_on_attempts", ()):
            await asyncio.Event().wait()  # until the process is killed or stopped
        await asyncio.sleep(float(job.payload.get("sleep", 0)))
    except asyncio.CancelledError:
        (folder / f"cancelled.{job.id}.{os.getpid()}").touch()
        raise
    with open(folder / f"finished.{os.getpid()}", "a") as out:
        out.write(f"{job.id}\n")
