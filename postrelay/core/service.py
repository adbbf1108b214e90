"""The one shape of background work: a loop that calls `run_once()` every interval, logs
and survives errors, and stops cleanly. Tests call `run_once()` directly."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from postrelay.core.telemetry import event


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
