"""new_uuids makes time-ordered UUIDs (version 7: this millisecond, then random bits) that
behave as any other UUID, and ids made later sort after ids made earlier."""

import pickle
import time
import uuid

from postrelay.core.ids import new_uuid, new_uuids


def test_the_ids_are_version_7_uuids_like_any_other() -> None:
    ids = new_uuids(5)
    assert len(ids) == 5
    for value in [*ids, new_uuid()]:
        assert isinstance(value, uuid.UUID)
        assert value.version == 7
        assert value.variant == uuid.RFC_4122
        parsed = uuid.UUID(str(value))
        assert parsed == value and hash(parsed) == hash(value)
        assert uuid.UUID(bytes=value.bytes) == value
        assert pickle.loads(pickle.dumps(value)) == value
        assert value.is_safe is uuid.SafeUUID.unknown


def test_the_first_48_bits_are_the_unix_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    value = new_uuid()
    after = time.time_ns() // 1_000_000
    assert before <= value.int >> 80 <= after


def test_later_ids_sort_after_earlier_ones() -> None:
    first = new_uuids(100)
    time.sleep(0.002)
    second = new_uuids(100)
    assert max(first) < min(second)


def test_the_bits_after_the_time_are_random() -> None:
    ids = new_uuids(2_000)
    assert len(set(ids)) == 2_000
    random_bits = (0xFFF << 64) | ((1 << 62) - 1)  # rand_a and rand_b of version 7
    ones = 0
    zeros = 0
    for value in ids:
        ones |= value.int
        zeros |= ~value.int
    # Each of the 74 random bits was seen both set and clear.
    assert ones & random_bits == random_bits
    assert zeros & random_bits == random_bits


def test_none_is_an_empty_list() -> None:
    assert new_uuids(0) == []
