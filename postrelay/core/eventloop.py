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
import os
import sys
import threading
import traceback
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from postrelay.core.telemetry import event

T = TypeVar("T")
R = TypeVar("R")


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # Windows, or an installation without it
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


# How long the tasks left once `main` has returned get to end on their cancel.
LEFTOVER_WAIT_SECS = 5.0


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, on `new_event_loop()`'s loop, except that what is left once
    `main` has returned gets LEFTOVER_WAIT_SECS to end. asyncio.run waits for it without a
    bound, and so does the interpreter's exit for a thread: a task a job's handler left
    behind that ignores its cancel, or a call it handed to a thread (`asyncio.to_thread`)
    that never returns, held the process after SIGTERM for good, its work all done. Such a
    thread cannot be stopped: the process then ends at once (os._exit), once logged."""
    calls = CallCounter(thread_name_prefix="postrelay-call")
    runner = asyncio.Runner(loop_factory=lambda: _loop_with(calls))
    try:
        return runner.run(main)
    finally:
        if _end_leftovers(runner.get_loop()):
            if not calls.wait_idle(LEFTOVER_WAIT_SECS):
                _exit_without(calls.running)
            runner.close()
        # Else the loop is left unclosed: closing it would wait for those tasks again.


class CallCounter(ThreadPoolExecutor):
    """The loop's default executor, counting the calls that have not returned: an idle
    worker thread of the pool and one stuck in a call look the same from outside."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.running = 0
        self._changed = threading.Condition()

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        with self._changed:
            self.running += 1
        try:
            return super().submit(self._counted, fn, *args, **kwargs)
        except BaseException:  # not taken (shut down): it never runs
            self._done()
            raise

    def _counted(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        try:
            return fn(*args, **kwargs)
        finally:
            self._done()

    def _done(self) -> None:
        with self._changed:
            self.running -= 1
            self._changed.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Whether every call has returned, waiting `timeout` at most."""
        with self._changed:
            return self._changed.wait_for(lambda: self.running == 0, timeout)


def _loop_with(executor: ThreadPoolExecutor) -> asyncio.AbstractEventLoop:
    loop = new_event_loop()
    loop.set_default_executor(executor)
    return loop


def _exit_without(stuck: int) -> None:
    """End the process now, with the code it would have ended with: the interpreter's exit
    joins every thread of the pool, and would wait for the stuck ones for good."""
    error = sys.exc_info()[1]
    event("postrelay.process.threads_abandoned", logging.ERROR, count=stuck,
          waited_secs=LEFTOVER_WAIT_SECS,
          reason="calls handed to threads have not returned; the process exits without them")
    if isinstance(error, SystemExit):
        code = error.code if isinstance(error.code, int) else 1
    elif isinstance(error, KeyboardInterrupt):
        code = 130
    elif error is not None:
        traceback.print_exception(error)
        code = 1
    else:
        code = 0
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


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
