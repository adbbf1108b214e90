"""timestamptz values at infinity, read. PostgreSQL has 'infinity' and '-infinity'; Python's
datetime has neither, and psycopg refuses them ("timestamp too large"). SQL written by hand
parks a job for good at available_at 'infinity', and every listing that read its row
failed, the other rows with it. They are read as the latest and earliest datetimes Python
has (the psycopg documentation's own answer), in UTC; so are the finite times PostgreSQL
holds beyond Python's years 1 to 9999 (4713 BC to 294276 AD).

    register_infinity(connection.adapters)   # each connection that lists rows (core/db.py)

Each loader wraps the one registered before it (psycopg's compiled one, when installed)
rather than subclassing psycopg's pure-Python class, which loads three times slower. Even
so it costs a Python call per timestamp, so the worker's and the relay's connections go
without it: the claim reads a job at '-infinity' as its creation time (queue/sql/claim.sql),
and 'infinity' is never claimed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from psycopg import DataError, abc
from psycopg.adapt import AdaptersMap, Loader
from psycopg.pq import Format

LATEST = datetime.max.replace(tzinfo=UTC)
EARLIEST = datetime.min.replace(tzinfo=UTC)
# How the server writes each infinity: in text, and in binary as the int64 extremes.
INFINITIES = {Format.TEXT: (b"infinity", b"-infinity"),
              Format.BINARY: ((2**63 - 1).to_bytes(8, "big", signed=True),
                              (-(2**63)).to_bytes(8, "big", signed=True))}


def register_infinity(adapters: AdaptersMap) -> None:
    oid = adapters.types["timestamptz"].oid
    for fmt, (plus, minus) in INFINITIES.items():
        finite = adapters.get_loader(oid, fmt)
        assert finite is not None  # psycopg registers both formats of timestamptz
        adapters.register_loader("timestamptz", _infinity_loader(finite, fmt, plus, minus))


def _infinity_loader(finite: type[abc.Loader], fmt: Format, plus: bytes,
                     minus: bytes) -> type[Loader]:
    class InfinityLoader(Loader):
        format = fmt

        def __init__(self, oid: int, context: abc.AdaptContext | None = None) -> None:
            super().__init__(oid, context)
            self._finite = finite(oid, context)

        def load(self, data: Any) -> datetime:
            if data == plus:
                return LATEST
            if data == minus:
                return EARLIEST
            try:
                return self._finite.load(data)  # type: ignore[no-any-return]
            except DataError:  # a finite time past Python's years: after 9999, or BC
                return EARLIEST if _before_year_one(data, fmt) else LATEST

    return InfinityLoader


def _before_year_one(data: Any, fmt: Format) -> bool:
    """Whether a timestamptz Python cannot hold lies before its years rather than after:
    the server writes such a time with a trailing " BC" in text, as a negative count of
    microseconds (since 2000) in binary."""
    if fmt == Format.TEXT:
        return bytes(data).endswith(b" BC")
    return int.from_bytes(bytes(data), "big", signed=True) < 0
