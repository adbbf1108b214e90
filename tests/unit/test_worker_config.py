"""A worker built in code gets its settings checked as the CLI's are, field by field."""

from __future__ import annotations

import math

import pytest

from postrelay.queue import WorkerConfig


@pytest.mark.parametrize(("field", "value"), [
    ("concurrency", 0), ("concurrency", 10_001), ("concurrency", 2**31), ("concurrency", 2.5),
    ("concurrency", True),
    ("lease_secs", 0), ("lease_secs", -1), ("lease_secs", math.nan), ("lease_secs", math.inf),
    ("poll_interval_secs", 0), ("poll_interval_secs", math.nan), ("poll_interval_secs", "1"),
    ("grace_secs", -1), ("grace_secs", math.nan),
    ("claim_ahead_secs", math.nan), ("claim_ahead_secs", -0.1),
    ("default_timeout_secs", 0), ("default_timeout_secs", math.nan),
])
def test_an_odd_setting_is_refused_by_name(field: str, value: object) -> None:
    # A lease or poll interval of 0 spun the heartbeat or the claim loop against the
    # database; NaN broke their waits; a concurrency past an integer column stopped the
    # worker at its start with the database's words.
    with pytest.raises(ValueError, match=f"^{field}: must be "):
        WorkerConfig(**{field: value})


def test_the_edges_that_make_sense_are_accepted() -> None:
    config = WorkerConfig(concurrency=10_000, grace_secs=0, claim_ahead_secs=0,
                          default_timeout_secs=math.inf, lease_secs=0.5,
                          poll_interval_secs=0.01)
    assert config.heartbeat_secs == 0.1
