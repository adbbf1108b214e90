"""Schedule rules of the hosted seed, checked without a database."""

from datetime import UTC, datetime

import pytest

from postrelay.core.errors import ValidationError
from postrelay.queue.cron import SCHEDULE_FORMAT, normalize_schedule, slots_between


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_five_fields_get_a_leading_zero_seconds_field() -> None:
    assert normalize_schedule("*/1 * * * *") == "0 */1 * * * *"
    assert normalize_schedule("  0 3 * * *  ") == "0 0 3 * * *"


def test_six_fields_are_kept_seconds_first() -> None:
    assert normalize_schedule("*/10 * * * * *") == "*/10 * * * * *"


@pytest.mark.parametrize("alias", ["@daily", "@hourly", "@reboot"])
def test_aliases_are_refused_with_the_expected_format(alias: str) -> None:
    with pytest.raises(ValidationError) as info:
        normalize_schedule(alias)
    assert info.value.field == "schedule" and SCHEDULE_FORMAT in str(info.value)


@pytest.mark.parametrize("bad", ["", "* * * *", "0 0 0 3 * * * *", "61 * * * *", "0 0 30 2 *",
                                 "* * * * * 99", "every minute", "0 3 * * * * 2027"])
def test_malformed_schedules_are_refused(bad: str) -> None:
    with pytest.raises(ValidationError) as info:
        normalize_schedule(bad)
    assert "expected 5 fields" in str(info.value)


def test_first_slot_after_creation_like_the_seed() -> None:
    # Created at 15:40 (plus a few seconds), fired at 15:41:00, then next_run 15:42:00.
    schedule = normalize_schedule("*/1 * * * *")
    assert slots_between(schedule, at("2026-11-30T15:40:07"), at("2026-11-30T15:40:59")) is None
    assert slots_between(schedule, at("2026-11-30T15:40:07"), at("2026-11-30T15:41:00.2")) == (
        at("2026-11-30T15:41:00"), at("2026-11-30T15:42:00"))


def test_after_downtime_only_the_latest_missed_slot_fires() -> None:
    schedule = normalize_schedule("0 * * * *")
    last_run = at("2026-11-30T01:00:00")
    assert slots_between(schedule, last_run, at("2026-11-30T05:30:00")) == (
        at("2026-11-30T05:00:00"), at("2026-11-30T06:00:00"))


def test_a_slot_exactly_now_is_due() -> None:
    schedule = normalize_schedule("*/5 * * * * *")
    assert slots_between(schedule, at("2026-11-30T00:00:00"), at("2026-11-30T00:00:05")) == (
        at("2026-11-30T00:00:05"), at("2026-11-30T00:00:10"))


# croniter takes a step past the field's range as "the first value only": `*/99` in the
# minute field fired hourly at :00, `*/25` hours daily at midnight -- never what was
# written, and no cron can repeat every 99 minutes. Refused, naming the field and the rule.
@pytest.mark.parametrize(("schedule", "field", "most"), [
    ("*/99 * * * *", "minute", 59),
    ("0 */25 * * *", "hour", 23),
    ("*/60 * * * * *", "second", 59),
    ("0 0 */31 * *", "day", 30),
    ("0 0 1 */12 *", "month", 11),
    ("0 0 * * */7", "weekday", 6),
    ("5-10/6 * * * *", "minute", 5),
    ("0 1/40 * * *", "hour", 22),
    ("0 0 * JAN-MAR/3 *", "month", 2),
    ("0,*/70 * * * *", "minute", 59),
])
def test_a_step_past_the_fields_range_is_refused(schedule: str, field: str, most: int) -> None:
    with pytest.raises(ValidationError) as info:
        normalize_schedule(schedule)
    message = str(info.value)
    assert info.value.field == "schedule"
    assert f"{field} field" in message and f"at most {most}" in message, message


@pytest.mark.parametrize("schedule", ["*/59 * * * *", "0 */23 * * *", "0 0 */30 * *",
                                      "0 0 1 */11 *", "0 0 * * */6", "5-10/5 * * * *",
                                      "0 22-6/2 * * *", "0 0 * * MON-FRI/2", "0 0 L * *"])
def test_steps_within_the_range_are_kept(schedule: str) -> None:
    assert normalize_schedule(schedule).endswith(schedule)


def test_a_schedule_longer_than_any_real_one_is_refused_before_it_is_read() -> None:
    """'0-59,0-59,...' 100,000 characters long was stored, and every worker's scheduler
    parsed it again each second (0.6 s a time): one tenant's entry slowed every other's.
    Every value of every field spelled out fits in the bound."""
    spelled_out = " ".join(",".join(map(str, range(lo, hi + 1)))
                           for lo, hi in ((0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 6)))
    assert normalize_schedule(spelled_out) == spelled_out
    with pytest.raises(ValidationError) as info:
        normalize_schedule(",".join(["0-59"] * 20_000) + " * * * *")
    assert str(info.value) == "schedule: must be at most 1024 characters, got 100007"


@pytest.mark.parametrize("schedule", ["R * * * *", "0 r * * *", "0 0 R(1-5) * *",
                                      "R/10 * * * * *", "0 0 1,R * *"])
def test_a_random_field_is_refused(schedule: str) -> None:
    """croniter reads `R` as a random value, drawn afresh each time a schedule is read:
    every scheduler, every round, drew another minute for `R * * * *`, and the entry
    fired dozens of times an hour instead of once."""
    with pytest.raises(ValidationError) as info:
        normalize_schedule(schedule)
    assert "random" in str(info.value) and SCHEDULE_FORMAT in str(info.value)


def test_a_stored_random_schedule_fails_instead_of_firing_at_random() -> None:
    """An entry written before the rule (or by hand) fails its firings, so it is listed as
    failing, rather than firing every time a new draw falls before now."""
    with pytest.raises(ValidationError, match="random"):
        slots_between("0 R * * * *", at("2026-11-30T10:00:00"), at("2026-11-30T11:00:00"))
