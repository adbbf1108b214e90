"""The event loop a postrelay server runs its connections on: uvloop's where it is
installed (a dependency everywhere but on Windows, which it does not support), asyncio's
otherwise.

    loop = new_event_loop()

uvloop keeps its transports, stream buffers and readiness polling in C. For a server that
reads and answers many small SMTP commands over many connections, that is a good part of
its CPU per message.
"""

from __future__ import annotations

import asyncio


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # Windows, or an installation without it
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
