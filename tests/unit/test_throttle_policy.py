"""ThrottlePolicy refuses settings under which a throttle could never recover."""

from __future__ import annotations

import pytest

from postrelay.queue import ThrottlePolicy


@pytest.mark.parametrize("args, field", [
    ({"step_secs": 0}, "step_secs"),
    ({"floor_per_sec": -1}, "floor_per_sec"),
    ({"free_per_sec": float("inf")}, "free_per_sec"),
    ({"floor_per_sec": 10, "free_per_sec": 5}, "free_per_sec"),
    ({"min_pause_secs": -1}, "min_pause_secs"),
])
def test_bad_settings_name_the_field(args, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        ThrottlePolicy(**args)


def test_the_defaults_recover_from_one_to_64_per_second_in_ten_second_steps():
    policy = ThrottlePolicy()
    assert (policy.floor_per_sec, policy.free_per_sec, policy.step_secs) == (1.0, 64.0, 10.0)
