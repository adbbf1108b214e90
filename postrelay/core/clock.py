"""Time in one place, so tests can pass "now" explicitly instead of sleeping."""

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)
