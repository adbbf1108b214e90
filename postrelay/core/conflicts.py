"""Transactions that lost to a concurrent one: a deadlock (40P01), or a serialization
failure (40001, under REPEATABLE READ or SERIALIZABLE, which a database's
default_transaction_isolation may impose). PostgreSQL rolled all of it back, and running
the whole transaction again is the remedy its documentation gives.

    done = in_transaction(engine, lambda conn: record_many(conn, reports), what="webhook")

Writers take their locks in one order, so that these stay rare; the retry covers an order
no single statement can control (another writer's). Bounded, with a short random pause
that grows, so that the two losers do not meet again at once: a caller that still loses
after ATTEMPTS gets the error, to answer "try again later" (a 503, a message left in the
inbox).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy import Connection, Engine

from postrelay.core.telemetry import event

T = TypeVar("T")
CONFLICTS = frozenset({"40P01", "40001"})  # deadlock_detected, serialization_failure
ATTEMPTS = 4
PAUSE_SECS = 0.02  # before the second attempt; doubled before each one after


def conflict_state(exc: BaseException) -> str | None:
    """The SQLSTATE when `exc` (psycopg's error, or SQLAlchemy's around one) says the
    transaction lost to a concurrent one; None for any other error."""
    state = getattr(getattr(exc, "orig", exc), "sqlstate", None)
    return state if state in CONFLICTS else None


def in_transaction(engine: Engine, work: Callable[[Connection], T], *, what: str,
                   attempts: int = ATTEMPTS) -> T:
    """`work` in a transaction of its own, committed; run again from the start (on a
    rolled-back transaction) when it loses to a concurrent one, `attempts` times at most."""
    for attempt in range(1, attempts + 1):
        try:
            with engine.begin() as conn:
                return work(conn)
        except Exception as exc:
            _lost(exc, what, attempt, attempts)
        time.sleep(_pause(attempt))
    raise AssertionError("unreachable")  # the last attempt returned or raised


async def in_transaction_async(work: Callable[[], Awaitable[T]], *, what: str,
                               attempts: int = ATTEMPTS) -> T:
    """`in_transaction` for a coroutine function that runs one transaction of its own."""
    for attempt in range(1, attempts + 1):
        try:
            return await work()
        except Exception as exc:
            _lost(exc, what, attempt, attempts)
        await asyncio.sleep(_pause(attempt))
    raise AssertionError("unreachable")


def _lost(exc: Exception, what: str, attempt: int, attempts: int) -> None:
    """Raise `exc` again unless it is a conflict worth another attempt; log that one."""
    state = conflict_state(exc)
    if state is None or attempt >= attempts:
        raise exc
    event("postrelay.db.conflict_retried", logging.WARNING, what=what, sqlstate=state,
          attempt=attempt, error=str(getattr(exc, "orig", exc)).splitlines()[0])


def _pause(attempt: int) -> float:
    return float(PAUSE_SECS * 2 ** (attempt - 1) * random.uniform(0.5, 1.5))  # noqa: S311
