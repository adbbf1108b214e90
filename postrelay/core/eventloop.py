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
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # Windows, or an installation without it
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, on `new_event_loop()`'s loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
