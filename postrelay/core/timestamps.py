"""timestamptz values at infinity, read. PostgreSQL has 'infinity' and '-infinity'; Python's
datetime has neither, and psycopg refuses them ("timestamp too large"). SQL written by hand
parks a job for good at available_at 'infinity', and every listing that read its row
failed, the other rows with it. They are read as the latest and earliest datetimes Python
has (the psycopg documentation's own answer), in UTC.

    register_infinity(psycopg.adapters)   # once, before any connection is made
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from psycopg.adapt import AdaptersMap
from psycopg.types.datetime import TimestamptzBinaryLoader, TimestamptzLoader

LATEST = datetime.max.replace(tzinfo=UTC)
EARLIEST = datetime.min.replace(tzinfo=UTC)
# In binary, PostgreSQL's infinities are the int64 extremes (DT_NOBEGIN, DT_NOEND).
BINARY_INFINITY = (2**63 - 1).to_bytes(8, "big", signed=True)
BINARY_MINUS_INFINITY = (-(2**63)).to_bytes(8, "big", signed=True)


class _TextLoader(TimestamptzLoader):
    def load(self, data: Any) -> datetime:
        if data == b"infinity":
            return LATEST
        if data == b"-infinity":
            return EARLIEST
        return super().load(data)


class _BinaryLoader(TimestamptzBinaryLoader):
    def load(self, data: Any) -> datetime:
        if data == BINARY_INFINITY:
            return LATEST
        if data == BINARY_MINUS_INFINITY:
            return EARLIEST
        return super().load(data)


def register_infinity(adapters: AdaptersMap) -> None:
    adapters.register_loader("timestamptz", _TextLoader)
    adapters.register_loader("timestamptz", _BinaryLoader)
