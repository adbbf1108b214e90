"""Ids made by the writer, so a batch knows its rows' ids without a RETURNING round trip.

The ids are time-ordered (the UUID version 7 layout: 48 bits of Unix milliseconds, then
74 random bits), not random. A job's row is written three times (enqueued, claimed, done),
and each write is a new row version that adds an entry to the primary key: with random ids
those entries land on random pages all over the index, and once the history makes the
index larger than the server's buffer cache every claim and completion reads a page and
writes it whole into the WAL after each checkpoint (a full-page image). Beside a million
done jobs a claim wrote 0.48 full-page images per job with random ids, 0.13 with these
(0.09 to 0.24 on an empty table; EXPLAIN (ANALYZE, WAL) of the claim, bench/growth_drain.py
for the drain itself). Time-ordered ids keep the live jobs' entries together at the right
edge of the index, the same few pages however large the history.
"""

from __future__ import annotations

import os
import time
from uuid import UUID

_VERSION_7 = (7 << 76) | (0x8000 << 48)  # version 7 and the RFC 4122 variant bits
_RAND_A = 0xFFF << 64  # 12 random bits after the version nibble
_RAND_B = (1 << 62) - 1  # 62 random bits after the variant


def new_uuids(n: int) -> list[UUID]:
    """n time-ordered UUIDs (version 7: this millisecond, then 74 random bits), from one
    read of the system's random source. Ids made in the same millisecond are not ordered
    among themselves, which costs nothing: they share the index's pages all the same."""
    stamp = (time.time_ns() // 1_000_000) << 80 | _VERSION_7
    random = os.urandom(16 * n)
    ids = []
    for start in range(0, 16 * n, 16):
        bits = int.from_bytes(random[start:start + 16])
        ids.append(UUID(int=stamp | bits & _RAND_A | bits & _RAND_B))
    return ids


def new_uuid() -> UUID:
    """One time-ordered UUID, as new_uuids makes them."""
    return new_uuids(1)[0]
