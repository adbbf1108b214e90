"""What a handler's return value makes of its run: ignored, but for the returns that
say its work was not done."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest

from postrelay.queue.handler_result import HandlerReturnError, outcome_of
from postrelay.queue.outcome import Failure, PermanentError, RetryAfter, Success


async def send() -> None:
    """Work that runs only when awaited."""


async def numbers():
    yield 1


@pytest.mark.parametrize("value", [None, 0, "", "sent", [1], {"id": 1}, Success(), map(str, ())])
def test_what_a_handler_returns_is_ignored(value: object) -> None:
    assert outcome_of(value) == Success()


@pytest.mark.parametrize("error", [RetryAfter(30), PermanentError("bad"), ValueError("x"),
                                   SystemExit(3)])
def test_an_exception_returned_is_as_if_raised(error: BaseException) -> None:
    assert outcome_of(error) == Failure(error)


def failure_text(value: object) -> str:
    outcome = outcome_of(value)
    assert isinstance(outcome, Failure) and isinstance(outcome.error, HandlerReturnError)
    return str(outcome.error)


def test_an_outcomes_class_returned_is_a_failure_that_says_raise_an_instance() -> None:
    assert "returned the class RetryAfter, not an instance" in failure_text(RetryAfter)
    assert "raise PermanentError(...)" in failure_text(PermanentError)


def test_a_coroutine_returned_unawaited_is_a_failure_and_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine was never awaited" would fail the test
        text = failure_text(send())
        gc.collect()
    assert "returned a coroutine (send) without awaiting it" in text


async def test_a_task_or_future_returned_unawaited_is_a_failure() -> None:
    task = asyncio.create_task(send())
    assert "returned a Task without awaiting it" in failure_text(task)
    await task
    future = asyncio.get_running_loop().create_future()
    assert "returned a Future without awaiting it" in failure_text(future)


@pytest.mark.parametrize("value", [(n for n in range(3)), numbers()])
def test_a_generator_returned_is_a_failure_its_body_never_ran(value: object) -> None:
    assert "whose body never ran" in failure_text(value)
