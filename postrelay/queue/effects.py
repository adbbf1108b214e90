"""Writes that commit in the same transaction as the job's outcome.

A handler that talks to the outside world often has to record what happened there — the
email layer records an SMTP reply, for instance — and that record must not be lost or
contradicted by the job's own state. Writing it in its own transaction leaves a window
where one is committed and the other is not; so a handler hands it to the queue instead:

    record_with_outcome(email_log_writer, row)

The completer then writes every recorded row, grouped by writer in one statement each,
inside the transaction that writes the job's next state (in one round trip with it:
queue/completer.py). The record is written whatever that state is (done, retry, DLQ), and
also when the job's claim was lost meanwhile: it describes what happened, which stays
true.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import TextClause


class EffectWriter(Protocol):
    """Turns many rows of one kind into one statement (and its parameters, sent in text),
    run inside the outcome's transaction. Its results are not read."""

    name: str

    def statement(self, rows: Sequence[Any]) -> tuple[TextClause, Any]: ...


class RowWriter:
    """An EffectWriter made of its name and a function that turns the rows into their
    statement: what most writers are.

        EMAIL_LOG = RowWriter("email_log", queries.email_log_upsert_many)
    """

    def __init__(self, name: str,
                 statement: Callable[[Sequence[Any]], tuple[TextClause, Any]]) -> None:
        self.name = name
        self.statement = statement


@dataclass(frozen=True, slots=True)
class Effect:
    writer: EffectWriter
    row: Any


_recorded: ContextVar[list[Effect] | None] = ContextVar("postrelay_effects", default=None)


def record_with_outcome(writer: EffectWriter, row: Any) -> None:
    """Write `row` with `writer` in the transaction that records this job's outcome."""
    effects = _recorded.get()
    if effects is None:
        raise RuntimeError("record_with_outcome is only valid while a job handler runs")
    effects.append(Effect(writer, row))


@contextmanager
def collecting() -> Iterator[list[Effect]]:
    """Collect the effects recorded by the handler run inside this block:

        with collecting() as effects:
            await handler(job)
    """
    effects: list[Effect] = []
    token = _recorded.set(effects)
    try:
        yield effects
    finally:
        _recorded.reset(token)


def effect_statements(effects: Sequence[Effect]) -> list[tuple[TextClause, Any]]:
    """One statement per writer, in the order writers were first used."""
    grouped: dict[int, tuple[EffectWriter, list[Any]]] = {}
    for effect in effects:
        grouped.setdefault(id(effect.writer), (effect.writer, []))[1].append(effect.row)
    return [writer.statement(rows) for writer, rows in grouped.values()]
