"""The listings' timestamptz loaders (core/timestamps.py) on a real server, in text and in
binary: every time PostgreSQL holds reads, those beyond Python's years as its extremes."""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest

from postrelay.core.timestamps import EARLIEST, LATEST, register_infinity

TIMES = {"infinity": LATEST, "-infinity": EARLIEST, "294276-12-31 23:59:59+00": LATEST,
         "12000-01-01 00:00:00+00": LATEST, "0044-03-15 00:00:00+00 BC": EARLIEST,
         "4713-01-01 00:00:00+00 BC": EARLIEST,
         "9999-12-31 23:59:59.999999+00": LATEST, "0001-01-01 00:00:00+00": EARLIEST,
         "2026-12-07 10:00:00+00": datetime(2026, 12, 7, 10, tzinfo=UTC)}


@pytest.mark.parametrize("binary", [False, True])
def test_every_time_postgresql_holds_reads(libpq, binary):
    with psycopg.connect(libpq) as conn:
        register_infinity(conn.adapters)
        conn.execute("SET TIME ZONE 'UTC'")
        for text, expected in TIMES.items():
            [(read,)] = conn.execute("SELECT CAST(%s AS timestamptz)", [text],
                                     binary=binary).fetchall()
            assert read == expected, (text, binary)
