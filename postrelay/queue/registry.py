"""Which coroutine runs which job kind.

    @handler("reindex", timeout=60)
    async def reindex(job: Job) -> None: ...

    registry.register("email_send", send, on_claim=prefetch)  # prefetch(jobs) when claimed

The decorator registers into the process-wide default registry, which `postrelay worker
--app mymodule` uses after importing `mymodule`. Tests and embedders can build their own
`Registry` and pass it to the worker instead.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from postrelay.core.errors import ValidationError
from postrelay.core.telemetry import event
from postrelay.queue.model import Job

HandlerFn = Callable[[Job], Awaitable[object]]
# What `postrelay kinds add` lets into the mdm.job_kind enum (core/migrate.py): a handler
# for a kind outside it can never be given a job; the worker only warned as it started.
KIND_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
# Told of a claim's jobs of its kind before any of them runs (some wait for a slot): a
# handler can start, for the whole batch at once, the reads its runs will need. It must not
# block; what it starts is its own to finish or drop.
ClaimHook = Callable[[Sequence[Job]], None]


@dataclass(frozen=True, slots=True)
class Handler:
    kind: str
    fn: HandlerFn
    timeout_secs: float | None = None
    on_claim: ClaimHook | None = None


class Registry:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        # What the handlers hold open (connections), released once the worker has stopped.
        self.closers: list[Callable[[], Awaitable[None]]] = []

    def register(self, kind: str, fn: HandlerFn, *, timeout: float | None = None,
                 on_claim: ClaimHook | None = None) -> None:
        if not isinstance(kind, str) or not KIND_NAME.fullmatch(kind):
            raise ValidationError("kind", f"{kind!r} must be lower-case letters, digits and "
                                          "underscores, starting with a letter, at most 63 "
                                          "characters, as `postrelay kinds add` allows")
        if inspect.isasyncgenfunction(fn):
            raise ValidationError("handler", f"the handler for {kind!r} must be an async def "
                                             "without yield: its body would never run")
        if not inspect.iscoroutinefunction(fn):
            raise ValidationError("handler", f"the handler for {kind!r} must be an async def")
        taken = self._handlers.get(kind)
        if taken is not None and _name(taken.fn) != _name(fn):
            # One of the two would be dropped without a word, and its jobs run by the other.
            raise ValidationError("kind", f"{kind!r} already has a handler, {_name(taken.fn)}; "
                                          f"{_name(fn)} cannot be registered for it too")
        # NaN passed `timeout <= 0`, then failed every run of the kind (uvloop cannot
        # schedule it; asyncio's deadline expires at once); a string raised TypeError.
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, int | float)
                                    or not timeout > 0):
            raise ValidationError("timeout", f"must be a positive number of seconds "
                                             f"(math.inf: no limit), got {timeout!r}")
        if on_claim is not None and not callable(on_claim):
            raise ValidationError("on_claim", f"must be a function, got {on_claim!r}")
        if on_claim is not None and inspect.iscoroutinefunction(on_claim):
            raise ValidationError("on_claim", "must be a plain function: it must not block "
                                              "the claim")
        self._handlers[kind] = Handler(kind, fn, timeout, on_claim)

    def handler(
        self, kind: str, *, timeout: float | None = None
    ) -> Callable[[HandlerFn], HandlerFn]:
        def decorate(fn: HandlerFn) -> HandlerFn:
            self.register(kind, fn, timeout=timeout)
            return fn

        return decorate

    def get(self, kind: str) -> Handler | None:
        return self._handlers.get(kind)

    def announce(self, jobs: Sequence[Job]) -> None:
        """Tell each kind's claim hook of its jobs in this claim. The hooks are read off
        the handlers each time: a registry has a few kinds, and no copy can fall behind."""
        hooks = {h.kind: h.on_claim for h in self._handlers.values() if h.on_claim}
        if not hooks:  # most workers: nothing to sort the claim for
            return
        by_kind: dict[str, list[Job]] = {}
        for job in jobs:
            if job.kind in hooks:
                by_kind.setdefault(job.kind, []).append(job)
        for kind, batch in by_kind.items():
            try:
                hooks[kind](batch)
            except BaseException as exc:  # only a head start lost: the runs do without it
                # Any exception, SystemExit included, and a repr() that fails too: either,
                # let through, ended the claim loop, and the worker claimed nothing more
                # while it heartbeat on.
                event("postrelay.worker.claim_hook_failed", logging.WARNING, kind=kind,
                      error=_said(exc))

    def kinds(self) -> list[str]:
        return sorted(self._handlers)

    def merged(self, other: Registry) -> Registry:
        """A new registry with this one's handlers, then `other`'s on top."""
        merged = Registry()
        merged._handlers = {**self._handlers, **other._handlers}
        merged.closers = [*self.closers, *other.closers]
        return merged


def _said(exc: BaseException) -> str:
    try:
        return repr(exc)
    except Exception:
        return f"{type(exc).__name__} (its repr() failed)"


def _name(fn: object) -> str:
    """`module.qualname`: the same function imported again (a module reloaded) is the
    same handler, not a second one."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


default_registry = Registry()


def handler(kind: str, *, timeout: float | None = None) -> Callable[[HandlerFn], HandlerFn]:
    """Register an `async def handler(job)` for `kind` in the default registry."""
    return default_registry.handler(kind, timeout=timeout)
