"""The one shape of background work: a component is its `run_once()` plus its schedule.

`run_once()` does one round and returns what it did (a count, a small result); the
schedule says, from that result, how long to wait before the next round. A `ServiceLoop`
does the rest, the same way for every component:

    class Sweeper:
        def __init__(self, engine: AsyncEngine, *, interval_secs: float) -> None:
            self.engine = engine
            self._loop = periodic("sweeper", self.run_once, interval_secs)

        async def run_once(self) -> int: ...          # one round: what it swept

        async def start(self) -> None:
            self._loop.start()

        async def stop(self) -> None:
            await self._loop.stop()

- it waits for the schedule, cut short by its wake event (a NOTIFY, new work);
- it clears the wake event before each round, so a wake-up during a round is kept;
- a round that raises is logged and the next one waits out an `ErrorBackoff`, which only
  `stop()` cuts short: wake-ups must not turn retries into a storm against a database
  that is down;
- `stop()` cancels it, mid-round if need be (a round's transaction rolls back).

Tests call `run_once()` directly. `Service` is what a process runs until it is signalled
(a worker with its maintenance and cron, a relay with its webhook directory).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from postrelay.core.telemetry import event

R = TypeVar("R")

# What to wait after a round that returned R: seconds (0: at once), or None: until woken.
Schedule = Callable[[R], float | None]


class Service(Protocol):
    """Something that runs in the background between `start()` and `stop()`."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def sleep_until_woken(wake: asyncio.Event, secs: float | None) -> None:
    """Wait until `wake` is set or `secs` pass (None: no limit), whichever comes first."""
    if wake.is_set():  # no timer to arm: a busy loop comes here once per round
        return
    try:
        async with asyncio.timeout(secs):
            await wake.wait()
    except TimeoutError:
        pass


class ErrorBackoff:
    """The waits after errors in a row: `base_secs`, doubling up to `max_secs`; a success
    starts again from `base_secs`. Equal bounds make a fixed wait."""

    __slots__ = ("base_secs", "max_secs", "_next")

    def __init__(self, base_secs: float, max_secs: float) -> None:
        if not 0 <= base_secs <= max_secs:
            raise ValueError("base_secs: must be at least 0 and at most max_secs")
        self.base_secs = base_secs
        self.max_secs = max_secs
        self._next = base_secs

    def failed(self) -> float:
        """The wait after this error; the next one waits twice as long, up to the max."""
        delay = self._next
        self._next = min(delay * 2, self.max_secs)
        return delay

    def succeeded(self) -> None:
        self._next = self.base_secs


class ServiceLoop(Generic[R]):
    """Runs `run_once` on `schedule` between `start()` and `stop()` (see the module)."""

    def __init__(
        self,
        name: str,
        run_once: Callable[[], Awaitable[R]],
        schedule: Schedule[R],
        *,
        backoff: ErrorBackoff,
        wake: asyncio.Event | None = None,
        first_wait: float | None = 0.0,
        failed_event: str | None = None,
    ) -> None:
        self.name = name
        self.run_once = run_once
        self.schedule = schedule
        self.backoff = backoff
        # Set it to cut the current wait short; owned here unless the caller shares one.
        self.wake = wake if wake is not None else asyncio.Event()
        self.first_wait = first_wait  # before the first round
        self.failed_event = failed_event or f"postrelay.{name}.error"
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the rounds (nothing if they are running)."""
        if not self.running:
            self._task = asyncio.create_task(self._run(), name=f"postrelay-{self.name}")

    async def stop(self) -> None:
        """Cancel the rounds and wait until they have ended; the loop can start again."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        wait = self.first_wait
        while True:
            if wait is None or wait > 0:
                await sleep_until_woken(self.wake, wait)
            else:
                await asyncio.sleep(0)  # at once, but let the tasks the round started run
            self.wake.clear()  # before the round: a wake-up during it is kept
            try:
                result = await self.run_once()
            except Exception as exc:  # a failed round must not end the loop
                delay = self.backoff.failed()
                event(self.failed_event, logging.WARNING, error=repr(exc), retry_in=delay)
                await asyncio.sleep(delay)
                wait = 0.0
                continue
            self.backoff.succeeded()
            wait = self.schedule(result)


def every(secs: float) -> Schedule[object]:
    """The schedule of a component that runs every `secs`, whatever a round did."""
    return lambda _: secs


def until_woken(_: object) -> None:
    """The schedule of a component that runs only when woken."""
    return None


def periodic(
    name: str, run_once: Callable[[], Awaitable[R]], interval_secs: float, *,
    first_wait: float | None = 0.0, failed_event: str | None = None,
) -> ServiceLoop[R]:
    """A loop that runs `run_once` every `interval_secs`, the same after an error."""
    return ServiceLoop(name, run_once, every(interval_secs),
                       backoff=ErrorBackoff(interval_secs, interval_secs),
                       first_wait=first_wait, failed_event=failed_event)
