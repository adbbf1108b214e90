"""LISTEN for wake-ups on a dedicated connection.

A notification is only a hint that work may be waiting; workers and relays poll as well,
so a lost notification (or a pooler that cannot LISTEN) costs latency, never work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg

from postrelay.core.service import ErrorBackoff
from postrelay.core.telemetry import event

RECONNECT_BASE_SECS = 0.1
RECONNECT_MAX_SECS = 5.0


class Listener:
    def __init__(self, libpq_url: str, channel: str, on_notify: Callable[[], None]) -> None:
        self.libpq_url = libpq_url
        self.channel = channel
        self.on_notify = on_notify
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"postrelay-listen-{self.channel}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        """Not a ServiceLoop: a round is a connection's life, which lasts while it is up;
        only the reconnect waits out the shared ErrorBackoff."""
        backoff = ErrorBackoff(RECONNECT_BASE_SECS, RECONNECT_MAX_SECS)
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.libpq_url, autocommit=True
                ) as conn:
                    await conn.execute(f"LISTEN {self.channel}")
                    self.connected.set()
                    backoff.succeeded()
                    # Anything may have been enqueued while we were not listening.
                    self.on_notify()
                    async for _ in conn.notifies():
                        self.on_notify()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.connected.clear()
                delay = backoff.failed()
                event("postrelay.listener.disconnected", logging.WARNING, error=repr(exc),
                      retry_in=delay)
                await asyncio.sleep(delay)
