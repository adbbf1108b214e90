"""The event loop a postrelay process runs on: uvloop's where it is installed (a dependency
everywhere but on Windows, which it does not support), asyncio's otherwise.

    loop = new_event_loop()            # the inbound receiver's, in its own thread
    run(run_until_signalled(worker))   # asyncio.run on that loop: the worker, the relay

uvloop keeps its transports, stream buffers, timers and readiness polling in C. For a
server that reads and answers many small SMTP commands, and for a worker that holds many
SMTP and database connections with a timer on each wait, that is a good part of its CPU
per message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

from postrelay.core.telemetry import event

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # Windows, or an installation without it
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


# How long the tasks left once `main` has returned get to end on their cancel.
LEFTOVER_WAIT_SECS = 5.0


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, on `new_event_loop()`'s loop, except that the tasks left once
    `main` has returned get LEFTOVER_WAIT_SECS to end on their cancel. asyncio.run waits
    for them without a bound: a task a job's handler started and left behind, which
    ignores its cancel, held the process after SIGTERM for good, its work all done."""
    runner = asyncio.Runner(loop_factory=new_event_loop)
    try:
        return runner.run(main)
    finally:
        if _end_leftovers(runner.get_loop()):
            runner.close()
        # Else the loop is left unclosed: closing it would wait for those tasks again.


def _end_leftovers(loop: asyncio.AbstractEventLoop) -> bool:
    """Cancel the loop's tasks and wait for them a while; whether all have ended."""
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.wait(tasks, timeout=LEFTOVER_WAIT_SECS))
    left = [task for task in tasks if not task.done()]
    if left:
        event("postrelay.process.tasks_abandoned", logging.ERROR, count=len(left),
              names=",".join(sorted({task.get_name() for task in left})),
              waited_secs=LEFTOVER_WAIT_SECS,
              reason="they ignored their cancel; the process exits without them")
    return not left
