"""new_uuids makes the UUIDs uuid4() would: same version and variant bits, random the rest,
and objects that behave as any other UUID."""

import pickle
import uuid

from postrelay.core.ids import new_uuids


def test_the_ids_are_version_4_uuids_like_any_other() -> None:
    ids = new_uuids(5)
    assert len(ids) == 5
    for value in ids:
        assert isinstance(value, uuid.UUID)
        assert value.version == 4
        assert value.variant == uuid.RFC_4122
        parsed = uuid.UUID(str(value))
        assert parsed == value and hash(parsed) == hash(value)
        assert uuid.UUID(bytes=value.bytes) == value
        assert pickle.loads(pickle.dumps(value)) == value
        assert value.is_safe is uuid.SafeUUID.unknown


def test_every_other_bit_is_random() -> None:
    ids = new_uuids(2_000)
    assert len(set(ids)) == 2_000
    fixed = (0xF000 << 64) | (0xC000 << 48)  # the version and variant bits
    ones = 0
    zeros = 0
    for value in ids:
        ones |= value.int
        zeros |= ~value.int
    random_bits = ((1 << 128) - 1) & ~fixed
    # Each of the 122 random bits was seen both set and clear.
    assert ones & random_bits == random_bits
    assert zeros & random_bits == random_bits


def test_none_is_an_empty_list() -> None:
    assert new_uuids(0) == []
