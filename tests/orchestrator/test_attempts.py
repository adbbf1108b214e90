"""What earlier attempts left decides what this one does: pure rules, no database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from postrelay.orchestrator.attempts import (
    Logged,
    LostAttempt,
    Rescue,
    SendCheck,
    attempt_log_id,
)

JOB = uuid.UUID("01900000-0000-7000-8000-000000000001")
T0 = datetime(2026, 12, 2, 12, 0, 0, 123456, tzinfo=UTC)


def check(logged=(), rescues=(), released_at=None) -> SendCheck:  # noqa: ANN001
    return SendCheck(tuple(logged), tuple(rescues), released_at, frozenset())


def test_the_log_id_of_an_attempt_is_fixed_by_its_claim_and_time_ordered():
    first = attempt_log_id(JOB, T0)
    assert first == attempt_log_id(JOB, T0.astimezone(timezone_plus_two()))  # same moment
    assert first.version == 7
    assert first != attempt_log_id(JOB, T0 + timedelta(microseconds=1))
    assert first != attempt_log_id(uuid.uuid4(), T0)
    assert first < attempt_log_id(JOB, T0 + timedelta(milliseconds=1))


def timezone_plus_two():  # noqa: ANN201
    from datetime import timezone
    return timezone(timedelta(hours=2))


def test_a_rescued_attempt_without_a_row_is_lost_under_its_own_id():
    rescue = Rescue(attempt=1, claimed_at=T0, at=T0 + timedelta(minutes=1))
    lost = check(rescues=[rescue]).lost_attempts(JOB)
    assert lost == [LostAttempt(1, attempt_log_id(JOB, T0), rescue.at)]
    # Once its row exists (logged `unknown`, or the slow worker's outcome), it is not again.
    row = Logged(attempt_log_id(JOB, T0), 1, "unknown", rescue.at)
    assert check(logged=[row], rescues=[rescue]).lost_attempts(JOB) == []


def test_a_rescue_from_before_the_claim_was_named_is_matched_by_attempt_number():
    rescue = Rescue(attempt=2, claimed_at=None, at=T0)
    assert [a.attempt for a in check(rescues=[rescue]).lost_attempts(JOB)] == [2]
    row = Logged(uuid.uuid4(), 2, "unknown", T0)  # its sending mark became this row
    assert check(logged=[row], rescues=[rescue]).lost_attempts(JOB) == []


def test_an_unknown_outcome_is_undecided_until_an_operator_sends_the_job_back():
    unknown = Logged(uuid.uuid4(), 1, "unknown", T0)
    assert check(logged=[unknown]).unknown_undecided([])
    assert not check(logged=[unknown], released_at=T0 + timedelta(seconds=1)).unknown_undecided([])
    lost = LostAttempt(1, uuid.uuid4(), T0)
    assert check().unknown_undecided([lost])
    assert not check(released_at=T0 + timedelta(seconds=1)).unknown_undecided([lost])
    assert not check(logged=[Logged(uuid.uuid4(), 1, "deferred", T0)]).unknown_undecided([])


def test_an_accepted_attempt_means_the_message_went_out():
    assert check(logged=[Logged(uuid.uuid4(), 1, "partial", T0)]).already_sent
    assert not check(logged=[Logged(uuid.uuid4(), 1, "unknown", T0)]).already_sent
