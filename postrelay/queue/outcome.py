"""What a run ended as, and the pure decision of the job's next state.

Handlers signal outcomes other than plain success or failure by raising one of the
exceptions below. `decide` maps every outcome to a `Transition` without touching the
database, so it is tested exhaustively on its own.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Literal

from postrelay.core.limits import storable
from postrelay.queue.backoff import Backoff
from postrelay.queue.effects import Effect
from postrelay.queue.jobspec import MAX_DELAY_SECS
from postrelay.queue.model import Job

ERROR_LIMIT = 4096  # last_error is cut to 4 KB, as the seed says
UNDECIDABLE_DELAY_SECS = 60.0  # before the next attempt of a run decide() could not place


class RetryAfter(Exception):  # noqa: N818 - an instruction, not an error
    """Run the job again after `delay_secs`; the attempt counts, as any other."""

    def __init__(self, delay_secs: float, reason: str = "retry requested") -> None:
        super().__init__(reason)
        self.delay_secs = bounded_delay(delay_secs)
        self.reason = reason


class PermanentError(Exception):
    """The job can never succeed: straight to the DLQ, no retries burnt."""


class Snooze(Exception):  # noqa: N818 - an instruction, not an error
    """Run the job again after `delay_secs` without counting this attempt: the job could
    not be tried at all (its resource is paused), so no retry is burnt."""

    def __init__(self, delay_secs: float, reason: str = "snoozed") -> None:
        super().__init__(reason)
        self.delay_secs = bounded_delay(delay_secs)
        self.reason = reason


def bounded_delay(delay_secs: float) -> float:
    """A handler's delay held to what enqueue's `delay` may be (NaN: 0): past it the next
    time overflows the database's interval, or lands after year 9999, where no reader can
    load it back."""
    secs = float(delay_secs)
    return min(max(secs, 0.0), MAX_DELAY_SECS) if secs == secs else 0.0


class StopJob(Exception):  # noqa: N818 - an instruction, not an error
    """Stop the job as `failed` for diagnosis: neither retried nor dead-lettered."""


@dataclass(frozen=True, slots=True)
class Success:
    pass


@dataclass(frozen=True, slots=True)
class Failure:
    error: BaseException


@dataclass(frozen=True, slots=True)
class Returned:
    """The run was not finished by this worker (shutdown): hand the job back uncounted."""


Outcome = Success | Failure | Returned
Status = Literal["pending", "done", "failed", "dlq"]


@dataclass(frozen=True, slots=True)
class Transition:
    status: Status
    delay_secs: float | None = None  # pending: wait this long before the next attempt
    error: str | None = None
    refund: bool = False  # give the claim's attempt back
    # Rows the handler recorded to commit with this outcome (see queue.effects).
    effects: tuple[Effect, ...] = ()


# The outcome of most runs, made once: both are immutable.
SUCCESS = Success()
DONE = Transition("done")


def decide(job: Job, outcome: Outcome, backoff: Backoff) -> Transition:
    match outcome:
        case Success():
            return DONE
        case Returned():
            return Transition("pending", delay_secs=0.0, refund=True)
        case Failure(error=Snooze() as exc):
            # The reason alone: a snooze is routine, its traceback says nothing. The delay
            # is bounded again here: a handler may have set it after __init__ bounded it.
            return Transition("pending", delay_secs=bounded_delay(exc.delay_secs),
                              error=snooze_error(exc), refund=True)
        case Failure(error=StopJob() as exc):
            return Transition("failed", error=format_error(exc))
        case Failure(error=PermanentError() as exc):
            return Transition("dlq", error=format_error(exc))
        case Failure(error=error):
            if job.attempts >= job.max_attempts:
                return Transition("dlq", error=format_error(error))
            delay = (bounded_delay(error.delay_secs) if isinstance(error, RetryAfter)
                     else backoff.delay(job.attempts))
            return Transition("pending", delay_secs=delay, error=format_error(error))
    raise TypeError(f"unknown outcome {outcome!r}")


def undecidable(job: Job, problem: Exception) -> Transition:
    """What a run ends as when decide() itself raised (a RetryAfter subclass that skipped
    RetryAfter's __init__, a delay set to a string, a backoff that fails): a failed
    attempt, retried after UNDECIDABLE_DELAY_SECS or dead-lettered as any other, with an
    error that says why, rather than a run whose task died with its job held running."""
    text = (f"the run's outcome could not be decided: {type(problem).__name__}: "
            f"{_message(problem)}")
    error = truncate_utf8(storable(text), ERROR_LIMIT)
    if job.attempts >= job.max_attempts:
        return Transition("dlq", error=error)
    return Transition("pending", delay_secs=UNDECIDABLE_DELAY_SECS, error=error)


def unrecordable(transition: Transition, refusal: BaseException, refusals: int) -> Transition:
    """What is written instead of an outcome the database refused `refusals` times on its
    own: the job goes to the DLQ, without the effects (its records of what happened), and
    its error says what the outcome was and why it is not there."""
    written = ", ".join(dict.fromkeys(e.writer.name for e in transition.effects)) or "none"
    text = (f"the outcome ({transition.status}) could not be recorded: the database refused "
            f"it {refusals} times: {type(refusal).__name__}: {refusal}; its records ({written}) "
            f"were not written")
    if transition.error:
        text += f"; the run's error: {transition.error}"
    return Transition("dlq", error=truncate_utf8(storable(text), ERROR_LIMIT))


def format_error(error: BaseException) -> str:
    """The error with its traceback, cut to ERROR_LIMIT bytes (keeping the end, where the
    cause is, when it is too long), storable: an error may quote what a server sent."""
    if isinstance(error, RetryAfter | StopJob | PermanentError) and error.__traceback__ is None:
        text = f"{type(error).__name__}: {_message(error)}"
    else:
        text = "".join(traceback.format_exception(error)).rstrip()
    return truncate_utf8(storable(text), ERROR_LIMIT)


def snooze_error(snooze: Snooze) -> str:
    """`snoozed: <reason>`, held to what format_error's text is: the reason is the
    handler's, and may quote a server's reply (a NUL, a lone surrogate), be long, or not
    even say what it is; written as it was, the database refused the outcome and the
    snoozed job went to the DLQ, or the run's task died with its job left running."""
    try:
        reason = str(snooze.reason)
    except Exception:
        reason = "<reason str() failed>"
    return truncate_utf8(storable(f"snoozed: {reason}"), ERROR_LIMIT)


def _message(error: BaseException) -> str:
    """str(error), or what the traceback module prints when a handler's exception class
    cannot say what it is."""
    try:
        return str(error)
    except Exception:
        return "<exception str() failed>"


def truncate_utf8(text: str, limit: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    marker = "…[truncated]…\n".encode()
    head = limit // 4
    tail = limit - head - len(marker)
    return (data[:head] + marker + data[-tail:]).decode("utf-8", errors="ignore")
