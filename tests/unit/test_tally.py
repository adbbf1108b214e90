"""The range a tally round takes (core/tally.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from postrelay.core.tally import tally_range

HOUR = timedelta(hours=1)
CUTOFF = datetime(2026, 12, 5, 13, tzinfo=UTC)


def take(until: datetime | None) -> tuple[datetime, datetime] | None:
    return tally_range(until, CUTOFF, unit=HOUR, catch_up=24 * HOUR, most=6)


def test_a_first_round_starts_at_the_catch_up_window_and_takes_at_most_its_share():
    assert take(None) == (CUTOFF - 24 * HOUR, CUTOFF - 18 * HOUR)
    assert take(CUTOFF - 30 * 24 * HOUR) == (CUTOFF - 24 * HOUR, CUTOFF - 18 * HOUR)


def test_later_rounds_go_from_the_mark_to_the_cutoff_and_then_take_nothing():
    assert take(CUTOFF - 2 * HOUR) == (CUTOFF - 2 * HOUR, CUTOFF)
    assert take(CUTOFF) is None
    assert take(CUTOFF + HOUR) is None  # a mark ahead of the clock (moved by hand)
