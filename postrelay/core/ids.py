"""Ids made by the writer, so a batch knows its rows' ids without a RETURNING round trip."""

from __future__ import annotations

import os
from uuid import UUID


def new_uuids(n: int) -> list[UUID]:
    """n random (version 4) UUIDs, as uuid4() makes them but from one read of the system's
    random source instead of one per id."""
    random = os.urandom(16 * n)
    return [UUID(bytes=random[i:i + 16], version=4) for i in range(0, 16 * n, 16)]
