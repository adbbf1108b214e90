"""Rates as operators write them: `14/s`, `1000/min`, `3600/h` (or a number per second).

Shared by the limits (postrelay.queue) and the settings that set one (POSTRELAY_SMTP_RATE).
"""

from __future__ import annotations

import math
import re

from postrelay.core.errors import ValidationError

RATE_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
              "h": 3600.0, "hour": 3600.0}
MAX_RATE_PER_SEC = 1_000_000.0
# The claim refills a bucket by rate x seconds idle (down to a microsecond), in float8, and
# PostgreSQL raises on a product that underflows to 0 rather than round it: a limit of
# 5e-324/s failed the limited claim of every limited kind, every tenant's. One job in
# 3e92 years is as slow as anyone needs, and leaves those products far from underflow.
MIN_RATE_PER_SEC = 1e-100
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*([a-z]+)\s*$")


def parse_rate(text: str | float, field: str = "rate") -> float:
    """Jobs per second. ValidationError naming `field` for anything that is not a rate,
    for a rate of 0 or less, one below 1e-100 per second, and one past a million per
    second."""
    if isinstance(text, bool):
        raise ValidationError(field, "must be a rate such as 14/s or 1000/min")
    if isinstance(text, int | float):
        # An int past float's range (10**400) is a rate past the maximum, not an error.
        per_sec = float(text) if abs(text) < 1e300 else (math.inf if text > 0 else -math.inf)
    else:
        match = _RATE.match(str(text).lower())
        if match is None or match.group(2) not in RATE_UNITS:
            raise ValidationError(
                field, f"must be a number per s, min or h, such as 14/s or 1000/min; "
                       f"got {str(text)[:40]!r}")
        per_sec = float(match.group(1)) / RATE_UNITS[match.group(2)]
    if math.isnan(per_sec) or per_sec <= 0:
        raise ValidationError(field, "must be more than 0")
    if per_sec < MIN_RATE_PER_SEC:
        raise ValidationError(field, f"must be at least {MIN_RATE_PER_SEC:g}/s")
    if per_sec > MAX_RATE_PER_SEC:
        raise ValidationError(field, f"must be at most {MAX_RATE_PER_SEC:,.0f}/s")
    return per_sec
