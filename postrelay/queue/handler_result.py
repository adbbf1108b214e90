"""What a handler's return value says about its run.

A handler's return value is ignored, with three exceptions, each a mistake that would
otherwise be taken for success while the work it stands for never ran:

    return send(job)          # a coroutine (or task, future) never awaited: a failure
    return RetryAfter(30)     # an exception returned instead of raised: as if raised
    return PermanentError     # an outcome's class, not an instance: a failure

and a generator, whose body never ran. An exception returned is taken as raised, as
River's `Work` returns its error: what the handler meant is plain.
"""

from __future__ import annotations

import inspect
from types import AsyncGeneratorType, CoroutineType, GeneratorType

from postrelay.queue.outcome import SUCCESS, Failure, Outcome


class HandlerReturnError(TypeError):
    """The handler returned something that says its work was not done."""


def outcome_of(value: object) -> Outcome:
    """The outcome of a run whose handler returned `value`."""
    if value is None:  # the usual case first
        return SUCCESS
    if isinstance(value, BaseException):
        return Failure(value)
    if isinstance(value, type) and issubclass(value, BaseException):
        return Failure(HandlerReturnError(
            f"the handler returned the class {value.__name__}, not an instance: raise "
            f"{value.__name__}(...) instead"))
    if isinstance(value, CoroutineType | GeneratorType):
        value.close()  # no "never awaited" warning: the error below says it
    if inspect.isawaitable(value):
        return Failure(HandlerReturnError(
            f"the handler returned {_kind(value)} without awaiting it: its work was not "
            f"done, or not waited for; await it"))
    if isinstance(value, GeneratorType | AsyncGeneratorType):
        return Failure(HandlerReturnError(
            f"the handler returned {_kind(value)}, whose body never ran: a handler is an "
            f"async def without yield"))
    return SUCCESS


def _kind(value: object) -> str:
    """`a coroutine (send)`, `a Task`: what was returned, named where it has a name."""
    name = getattr(value, "__qualname__", None)
    kind = type(value).__name__
    return f"a {kind} ({name})" if isinstance(name, str) else f"a {kind}"
