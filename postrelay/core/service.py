"""The one shape of background work: a loop that calls `run_once()` every interval, logs
and survives errors, and stops cleanly. Tests call `run_once()` directly.

`Service` is what a process runs until it is signalled (a worker with its maintenance and
cron, a relay with its webhook directory); `sleep_until_woken` is the wait of every loop
that a NOTIFY or a finished job can cut short."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from postrelay.core.telemetry import event


class Service(Protocol):
    """Something that runs in the background between `start()` and `stop()`."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def sleep_until_woken(wake: asyncio.Event, secs: float) -> None:
    """Wait until `wake` is set or `secs` pass, whichever comes first."""
    try:
        async with asyncio.timeout(secs):
            await wake.wait()
    except TimeoutError:
        pass


class Looper:
    name = "looper"

    def __init__(self, interval_secs: float) -> None:
        self.interval_secs = interval_secs
        self._task: asyncio.Task[None] | None = None

    async def run_once(self) -> Any:
        raise NotImplementedError

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=f"postrelay-{self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed round must not end the loop
                event(f"postrelay.{self.name}.error", logging.WARNING, error=repr(exc))
            await asyncio.sleep(self.interval_secs)
