"""A relay built in code gets its settings checked as the CLI's are, field by field."""

from __future__ import annotations

import math

import pytest

from postrelay.relay import RelayConfig


@pytest.mark.parametrize(("field", "value"), [
    ("batch_size", 0), ("batch_size", -1), ("batch_size", 10_001), ("batch_size", 2.5),
    ("batch_size", True),
    ("max_attempts", 0), ("max_attempts", 2**31), ("max_attempts", "3"),
    ("concurrency", 0), ("concurrency", 33),
    ("max_jobs_per_event", 0), ("max_jobs_per_event", 1_000_001), ("max_jobs_per_event", 1.5),
    ("poll_min_secs", 0), ("poll_min_secs", -0.1), ("poll_min_secs", math.nan),
    ("poll_max_secs", math.inf), ("poll_max_secs", "1"),
])
def test_an_odd_setting_is_refused_by_name(field: str, value: object) -> None:
    # A batch size of 0 claimed nothing, yet every empty batch counted as full: the relay
    # spun against the database and relayed no event. A poll interval of 0 spun, NaN broke
    # the waits, a negative batch size failed every batch with the database's words.
    with pytest.raises(ValueError, match=f"^{field}: must be "):
        RelayConfig(**{field: value})


def test_the_longest_wait_is_not_shorter_than_the_first() -> None:
    with pytest.raises(ValueError, match=r"^poll_max_secs: must be at least poll_min_secs"):
        RelayConfig(poll_min_secs=2.0, poll_max_secs=1.0)


def test_the_edges_that_make_sense_are_accepted() -> None:
    RelayConfig(batch_size=1, max_attempts=1, concurrency=1, poll_min_secs=0.001,
                poll_max_secs=0.001, max_jobs_per_event=1)
    RelayConfig(batch_size=10_000, max_attempts=1_000_000, concurrency=32, poll_max_secs=3600,
                max_jobs_per_event=1_000_000)
