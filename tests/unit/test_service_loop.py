"""The one shape of background work (core/service.py): a component's run_once() on its
schedule, cut short by its wake event, backed off after errors, stopped by stop()."""

from __future__ import annotations

import asyncio
import logging

import pytest

from postrelay.core.service import ErrorBackoff, ServiceLoop, until_woken

GUARD = 10.0  # only against a hang: nothing here waits for a timer


class Counter:
    """A component: each round counts one more, or raises while `failures` remain."""

    def __init__(self, failures: int = 0) -> None:
        self.rounds = 0
        self.failures = failures
        self.done: asyncio.Queue[int] = asyncio.Queue()  # the rounds that returned
        self.attempts = asyncio.Queue[None]()  # every round, failed or not
        self.during: asyncio.Event | None = None  # set from inside the next round

    async def run_once(self) -> int:
        self.attempts.put_nowait(None)
        if self.during is not None:
            self.during.set()
            self.during = None
        if self.failures:
            self.failures -= 1
            raise ConnectionError("the database went away")
        self.rounds += 1
        self.done.put_nowait(self.rounds)
        return self.rounds


async def next_round(component: Counter) -> int:
    return await asyncio.wait_for(component.done.get(), GUARD)


async def settle() -> None:
    """Let every task that can run, run (a round needs a handful of loop iterations)."""
    for _ in range(20):
        await asyncio.sleep(0)


def failures_logged(caplog: pytest.LogCaptureFixture, name: str) -> list[float]:
    return [r.fields["retry_in"] for r in caplog.records  # type: ignore[attr-defined]
            if getattr(r, "event", None) == name]


def test_the_error_backoff_doubles_up_to_its_max_and_a_success_resets_it():
    backoff = ErrorBackoff(0.1, 0.5)
    assert [backoff.failed() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.succeeded()
    assert backoff.failed() == 0.1
    fixed = ErrorBackoff(2.0, 2.0)
    assert [fixed.failed() for _ in range(3)] == [2.0, 2.0, 2.0]
    with pytest.raises(ValueError, match="base_secs"):
        ErrorBackoff(1.0, 0.5)


async def test_each_rounds_result_sets_the_wait_before_the_next():
    component, seen = Counter(), []

    def schedule(result: int) -> float | None:
        seen.append(result)
        return 0.0 if result < 3 else None  # three rounds at once, then until woken

    loop = ServiceLoop("counter", component.run_once, schedule, backoff=ErrorBackoff(1, 1))
    loop.start()
    try:
        assert [await next_round(component) for _ in range(3)] == [1, 2, 3]
        await settle()
        assert seen == [1, 2, 3] and component.rounds == 3  # now it waits for a wake-up
        loop.wake.set()
        assert await next_round(component) == 4
    finally:
        await loop.stop()


async def test_a_wake_up_cuts_the_wait_short_and_one_during_a_round_is_kept():
    component = Counter()
    loop = ServiceLoop("counter", component.run_once, lambda _: 3600.0,
                       backoff=ErrorBackoff(1, 1))
    loop.start()
    try:
        assert await next_round(component) == 1
        loop.wake.set()  # an hour's wait, cut short
        assert await next_round(component) == 2
        component.during = loop.wake  # a NOTIFY that arrives while the round runs
        loop.wake.set()
        assert await next_round(component) == 3
        assert await next_round(component) == 4  # the one that came during round 3
        await settle()
        assert component.rounds == 4
    finally:
        await loop.stop()


async def test_stop_ends_a_round_in_progress_and_the_loop_can_start_again():
    entered, cancelled = asyncio.Event(), asyncio.Event()

    async def stuck() -> int:
        entered.set()
        try:
            await asyncio.Event().wait()  # never set: a round that does not end by itself
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 0

    loop = ServiceLoop("stuck", stuck, until_woken, backoff=ErrorBackoff(1, 1))
    loop.start()
    await asyncio.wait_for(entered.wait(), GUARD)
    assert loop.running
    await asyncio.wait_for(loop.stop(), GUARD)
    assert cancelled.is_set() and not loop.running
    await loop.stop()  # a second stop is harmless
    entered.clear()
    loop.start()
    await asyncio.wait_for(entered.wait(), GUARD)
    await loop.stop()


async def test_errors_are_logged_and_backed_off_and_a_success_resets_the_backoff(caplog):
    caplog.set_level(logging.WARNING, logger="postrelay")
    component = Counter(failures=3)
    loop = ServiceLoop("counter", component.run_once, until_woken,
                       backoff=ErrorBackoff(0.001, 0.002))
    loop.start()
    try:
        assert await next_round(component) == 1  # the loop outlived three errors
        assert failures_logged(caplog, "postrelay.counter.error") == [0.001, 0.002, 0.002]
        component.failures = 1
        loop.wake.set()
        assert await next_round(component) == 2
        assert failures_logged(caplog, "postrelay.counter.error")[3:] == [0.001]
    finally:
        await loop.stop()


async def test_only_stop_cuts_an_error_backoff_short(caplog):
    caplog.set_level(logging.WARNING, logger="postrelay")
    component = Counter(failures=1)
    loop = ServiceLoop("counter", component.run_once, until_woken,
                       backoff=ErrorBackoff(3600, 3600), failed_event="postrelay.counter.failed")
    loop.start()
    await asyncio.wait_for(component.attempts.get(), GUARD)
    await settle()
    assert failures_logged(caplog, "postrelay.counter.failed") == [3600]
    loop.wake.set()  # NOTIFYs during an outage must not turn the backoff into a retry storm
    await settle()
    assert component.attempts.empty() and component.rounds == 0
    await asyncio.wait_for(loop.stop(), GUARD)  # but a stop does not wait out the hour
    assert not loop.running
