"""Ids made by the writer, so a batch knows its rows' ids without a RETURNING round trip."""

from __future__ import annotations

import os
from uuid import UUID, SafeUUID

# The version (4) and RFC 4122 variant bits, as uuid.UUID(version=4) sets them.
_CLEARED = ~((0xF000 << 64) | (0xC000 << 48))
_VERSION_4 = (4 << 76) | (0x8000 << 48)
_new = object.__new__
_set = object.__setattr__


def new_uuids(n: int) -> list[UUID]:
    """n random (version 4) UUIDs, as uuid4() makes them but from one read of the system's
    random source instead of one per id.

    Each UUID is filled in the way `UUID.__setstate__` (unpickling) fills one, skipping
    the constructor's argument checks: an id then costs 0.51 µs instead of 1.26 µs, which
    was a tenth of the client's time per job in `enqueue_many`."""
    random = os.urandom(16 * n)
    ids = []
    for start in range(0, 16 * n, 16):
        uuid = _new(UUID)
        _set(uuid, "int", (int.from_bytes(random[start:start + 16]) & _CLEARED) | _VERSION_4)
        _set(uuid, "is_safe", SafeUUID.unknown)
        ids.append(uuid)
    return ids
