"""decide() maps every outcome to the next row state, without a database."""

import math
import random
import uuid
from datetime import UTC, datetime

import pytest

from postrelay.queue.backoff import ExponentialBackoff, FixedBackoff
from postrelay.queue.executor import JobTimeout
from postrelay.queue.jobspec import MAX_DELAY_SECS
from postrelay.queue.model import Job
from postrelay.queue.outcome import (
    ERROR_LIMIT,
    Failure,
    PermanentError,
    RetryAfter,
    Returned,
    Snooze,
    StopJob,
    Success,
    Transition,
    decide,
    truncate_utf8,
)

NOW = datetime(2026, 11, 30, tzinfo=UTC)


def job(attempts: int = 1, max_attempts: int = 3) -> Job:
    return Job(uuid.uuid4(), uuid.uuid4(), "reindex", {}, 100, attempts, max_attempts, NOW, NOW,
               NOW, None)


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


FIXED = FixedBackoff(5)


def test_success_is_done() -> None:
    assert decide(job(), Success(), FIXED) == Transition("done")


def test_success_on_last_attempt_is_done() -> None:
    assert decide(job(3, 3), Success(), FIXED).status == "done"


def test_error_with_attempts_left_goes_back_to_pending_after_backoff() -> None:
    t = decide(job(1, 3), Failure(raised(ValueError("boom"))), FIXED)
    assert t.status == "pending" and t.delay_secs == 5 and not t.refund
    assert "ValueError: boom" in t.error and "Traceback" in t.error


def test_error_on_last_attempt_is_dlq() -> None:
    t = decide(job(3, 3), Failure(raised(ValueError("boom"))), FIXED)
    assert t.status == "dlq" and t.delay_secs is None and "boom" in t.error


def test_error_past_max_attempts_after_operator_retry_is_dlq() -> None:
    assert decide(job(9, 8), Failure(raised(ValueError())), FIXED).status == "dlq"


def test_timeout_is_an_ordinary_failure() -> None:
    t = decide(job(1, 3), Failure(JobTimeout("job exceeded its timeout of 1 s")), FIXED)
    assert t.status == "pending" and "timeout" in t.error


def test_retry_after_uses_its_own_delay() -> None:
    t = decide(job(1, 3), Failure(raised(RetryAfter(42, "rate limited"))), FIXED)
    assert t == Transition("pending", delay_secs=42.0, error=t.error)
    assert "rate limited" in t.error


@pytest.mark.parametrize(("asked", "given"), [
    (1e12, MAX_DELAY_SECS), (math.inf, MAX_DELAY_SECS), (-5, 0.0), (math.nan, 0.0)])
def test_a_handlers_delay_is_held_to_what_enqueue_allows(asked: float, given: float) -> None:
    """Past it the job's next time overflowed the database (every retry of the write
    failed) or fell after year 9999, which no list of jobs could load."""
    retried = decide(job(1, 3), Failure(raised(RetryAfter(asked))), FIXED)
    snoozed = decide(job(1, 3), Failure(raised(Snooze(asked))), FIXED)
    assert retried.delay_secs == snoozed.delay_secs == given


def test_retry_after_on_last_attempt_is_dlq() -> None:
    assert decide(job(3, 3), Failure(raised(RetryAfter(1))), FIXED).status == "dlq"


def test_permanent_error_goes_to_dlq_without_burning_retries() -> None:
    t = decide(job(1, 8), Failure(raised(PermanentError("bad address"))), FIXED)
    assert t.status == "dlq" and "bad address" in t.error


def test_stop_is_failed_for_diagnosis() -> None:
    t = decide(job(1, 8), Failure(raised(StopJob("inspect me"))), FIXED)
    assert t.status == "failed" and "inspect me" in t.error


def test_returned_at_shutdown_refunds_the_attempt() -> None:
    expected = Transition("pending", delay_secs=0.0, refund=True)
    assert decide(job(2, 3), Returned(), FIXED) == expected


def test_error_text_is_cut_to_4kb_keeping_the_end() -> None:
    t = decide(job(1, 3), Failure(raised(ValueError("x" * 20_000 + "THE-END"))), FIXED)
    assert len(t.error.encode()) <= ERROR_LIMIT
    assert t.error.endswith("THE-END") and "truncated" in t.error


@pytest.mark.parametrize("error", [raised(ValueError("550 unknown \udce0 \x00 user")),
                                   PermanentError("550 unknown \udce0 \x00 user")])
def test_error_text_quoting_bytes_that_are_not_text_is_storable(error: BaseException) -> None:
    # An SMTP reply decoded with surrogateescape: its error could neither be encoded (the
    # run's task died, its job left running) nor stored (NUL) before.
    t = decide(job(3, 3), Failure(error), FIXED)
    assert t.status == "dlq" and "550 unknown \ufffd \ufffd user" in t.error
    t.error.encode("utf-8")


class Unsayable(PermanentError):
    def __str__(self) -> str:
        raise ValueError("no words")


@pytest.mark.parametrize("error", [Unsayable(), raised(Unsayable())])
def test_an_error_that_cannot_say_what_it_is_still_ends_its_job(error: BaseException) -> None:
    # Formatting it raised, and the run's task died with its job left running.
    t = decide(job(1, 3), Failure(error), FIXED)
    assert t.status == "dlq" and "<exception str() failed>" in t.error


def test_truncate_utf8_never_splits_a_character() -> None:
    text = "é" * 5000
    cut = truncate_utf8(text, 4096)
    assert len(cut.encode()) <= 4096
    cut.encode("utf-8")  # valid


def test_fixed_backoff_is_constant() -> None:
    assert [FIXED.delay(n) for n in (1, 2, 10)] == [5, 5, 5]


def test_exponential_backoff_doubles_with_jitter_and_cap() -> None:
    backoff = ExponentialBackoff(base_secs=1, cap_secs=60, rng=random.Random(7))
    for attempts, ceiling in [(1, 1), (2, 2), (3, 4), (6, 32), (7, 60), (50, 60), (10_000, 60)]:
        delays = [backoff.delay(attempts) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), (attempts, delays[:3])
    assert len({backoff.delay(5) for _ in range(20)}) > 1  # jittered


@pytest.mark.parametrize("bad", [0, -1])
def test_exponential_backoff_tolerates_odd_attempt_numbers(bad: int) -> None:
    assert 0 < ExponentialBackoff(2, 10).delay(bad) <= 2


def test_snooze_retries_later_without_counting_the_attempt() -> None:
    for attempts in (1, 3):  # even on the last attempt: a snooze never dead-letters
        transition = decide(job(attempts=attempts), Failure(raised(Snooze(42, "paused"))), FIXED)
        assert transition == Transition("pending", delay_secs=42.0, error="snoozed: paused",
                                        refund=True)


class Unprintable:
    def __str__(self) -> str:
        raise ValueError("no words")

    __repr__ = __str__


@pytest.mark.parametrize(("reason", "shown"), [
    ("421 busy \x00 \udce0", "snoozed: 421 busy \ufffd \ufffd"),
    ("x" * 100_000 + "THE-END", "THE-END"),
    (Unprintable(), "snoozed: <reason str() failed>"),
])
def test_a_snoozes_reason_is_storable_cut_to_4kb_and_never_raises(reason, shown) -> None:
    # A NUL made the database refuse the outcome (the snoozed job went to the DLQ); a long
    # reason went into last_error whole; one that cannot say what it is killed the run.
    t = decide(job(), Failure(raised(Snooze(5, reason))), FIXED)
    assert (t.status, t.refund) == ("pending", True) and shown in t.error
    assert len(t.error.encode("utf-8")) <= ERROR_LIMIT
