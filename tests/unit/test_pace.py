"""ClaimPace: how much a worker claims ahead and how long freed slots gather, from run times."""

from __future__ import annotations

import pytest

from postrelay.queue.pace import (
    CLAIM_AHEAD_MAX_JOBS,
    CLAIM_GATHER_SECS,
    HOLD_LIMIT_SECS,
    ClaimPace,
)


def test_nothing_is_claimed_ahead_before_a_run_or_when_switched_off():
    assert ClaimPace(concurrency=10, claim_ahead_secs=0.01).ahead() == 0
    off = ClaimPace(concurrency=10, claim_ahead_secs=0.0)
    off.ran(0.001)
    assert off.ahead() == 0


@pytest.mark.parametrize(("run_secs", "ahead"), [
    (0.001, 90),  # 0.01 s of ten slots' worth, capped at nine per slot
    (0.004, 25),
    (0.02, 5),
    (0.5, 0),  # slow runs: never claimed ahead
])
def test_claiming_ahead_follows_the_pace_of_the_runs(run_secs, ahead):
    pace = ClaimPace(concurrency=10, claim_ahead_secs=0.01)
    pace.ran(run_secs)
    assert pace.ahead() == ahead


def test_claiming_ahead_never_exceeds_the_cap():
    pace = ClaimPace(concurrency=50, claim_ahead_secs=0.01)
    pace.ran(0.0001)
    assert pace.ahead() == CLAIM_AHEAD_MAX_JOBS


def test_runs_longer_than_claim_ahead_secs_gather_half_short_ones_a_quarter():
    pace = ClaimPace(concurrency=50, claim_ahead_secs=0.01)
    assert pace.gather_part() == 4  # no run yet
    pace.ran(0.002)
    assert pace.gather_part() == 4
    for _ in range(50):  # the moving average catches up with longer runs
        pace.ran(0.04)
    assert pace.gather_part() == 2


def test_a_long_hold_stops_claiming_ahead_until_runs_are_short_again():
    pace = ClaimPace(concurrency=10, claim_ahead_secs=0.01)
    pace.ran(0.001)
    assert pace.ahead() > 0
    pace.held_too_long(pace.hold_limit_secs)
    assert pace.ahead() == 0 and pace.hold_limit_secs == 1.0
    for _ in range(100):
        pace.ran(0.001)
    assert pace.ahead() > 0


def test_a_gathering_ends_after_its_time_and_starts_afresh_after_a_claim():
    pace = ClaimPace(concurrency=10, claim_ahead_secs=0.01)
    assert pace.gather_wait(now=100.0) == pytest.approx(CLAIM_GATHER_SECS)
    assert pace.gather_wait(now=100.01) == pytest.approx(CLAIM_GATHER_SECS - 0.01)
    assert pace.gather_wait(now=100.03) < 0  # over: claim now
    pace.claiming()
    assert pace.gather_wait(now=200.0) == pytest.approx(CLAIM_GATHER_SECS)


def test_a_hold_ends_after_a_hundred_times_the_claim_ahead_time_and_a_second_at_most():
    assert ClaimPace(concurrency=10, claim_ahead_secs=0.002).hold_limit_secs == \
        pytest.approx(0.2)
    # A pause of a kind stops its held jobs from starting within this time.
    assert ClaimPace(concurrency=10, claim_ahead_secs=0.03).hold_limit_secs == HOLD_LIMIT_SECS
    assert ClaimPace(concurrency=10, claim_ahead_secs=5.0).hold_limit_secs == HOLD_LIMIT_SECS
