"""What a receiver's answer means for the delivery job: a pure decision, tested on its own.

    2xx                 delivered
    410 Gone            the endpoint is disabled; the job stops (`failed`), not retried
    429, 502, 503, 504  retry after the receiver's Retry-After (seconds or HTTP date), or
                        with the worker's backoff when it sends none; a 429 or 503 also
                        throttles the endpoint for every worker (handler.py)
    other 5xx           retry with backoff
    3xx                 permanent: redirects are not followed (the URL must be fixed)
    other 4xx           permanent: straight to the DLQ, no retries burnt
"""

from __future__ import annotations

import email.utils
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

RETRY_AFTER_STATUSES = frozenset({429, 502, 503, 504})
# The receiver asks senders to slow down: its endpoint is throttled for every worker
# (queue/throttles.py), as well as this delivery retried.
THROTTLE_STATUSES = frozenset({429, 503})
RETRY_AFTER_CAP_SECS = 3600.0  # a receiver cannot park a delivery for longer than this

Action = Literal["delivered", "gone", "retry", "permanent"]


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    delay_secs: float | None = None  # retry: the receiver's Retry-After; None = backoff


def verdict(status: int, retry_after: str | None, now: datetime,
            *, cap_secs: float = RETRY_AFTER_CAP_SECS) -> Verdict:
    if 200 <= status <= 299:
        return Verdict("delivered")
    if status == 410:
        return Verdict("gone")
    if status in RETRY_AFTER_STATUSES:
        delay = parse_retry_after(retry_after, now)
        return Verdict("retry", None if delay is None else min(delay, cap_secs))
    if status >= 500:
        return Verdict("retry")
    return Verdict("permanent")  # 1xx as a final answer, 3xx, other 4xx


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a Retry-After value (delta-seconds or an HTTP date); None when
    missing or unreadable. A date in the past means "now"."""
    if value is None:
        return None
    value = value.strip()
    # ASCII digits only (RFC 9110's DIGIT): str.isdigit() also takes "²" or "٣", which
    # float() refuses or reads as another number.
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a naive parse means "-0000"
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())
