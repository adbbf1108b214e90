"""Jinja2 filters and globals: times, durations, numbers and ids as the pages show them.

All times are shown in UTC, as cron schedules and the CLI use it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from postrelay.dashboard.queries import EMAIL_STATUSES
from postrelay.queue.schema import STATUSES


def when(value: datetime | None) -> str:
    """`2024-05-01 12:03:04` (UTC)."""
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def duration(secs: float | None) -> str:
    """A compact duration: `850 ms`, `42 s`, `3 m 20 s`, `5 h 02 m`, `3 d 4 h`."""
    if secs is None:
        return "—"
    secs = max(float(secs), 0.0)
    if secs < 1:
        return f"{secs * 1000:.0f} ms"
    if secs < 60:
        return f"{secs:.0f} s"
    minutes, s = divmod(int(secs), 60)
    if minutes < 60:
        return f"{minutes} m {s:02d} s"
    hours, m = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {m:02d} m"
    days, h = divmod(hours, 24)
    return f"{days} d {h} h"


def ago(value: datetime | None) -> str:
    """`3 m 20 s ago` or `in 5 s` relative to now."""
    if value is None:
        return "—"
    delta = (datetime.now(UTC) - value).total_seconds()
    return f"{duration(delta)} ago" if delta >= 0 else f"in {duration(-delta)}"


def number(value: int | None) -> str:
    """12,345 (a thin space would be nicer, but tests and people both grep for commas)."""
    return "—" if value is None else f"{value:,}"


def short(value: UUID | str | None) -> str:
    """The first 8 characters of an id; the full id is in the link and its title."""
    return "—" if value is None else str(value)[:8]


def plural(count: int, word: str) -> str:
    return f"{count:,} {word}" + ("" if count == 1 else "s")


def query(params: dict[str, Any], **overrides: Any) -> str:
    """A query string of the non-empty `params`, with `overrides` applied."""
    merged = {**params, **overrides}
    return urlencode({k: v for k, v in merged.items() if v not in (None, "")})


def tenant_name(tenants: dict[UUID, str], tenant_id: UUID | str | None) -> str:
    """The tenant's name; ids may come as UUIDs or (from JSON) as strings."""
    try:
        key = tenant_id if isinstance(tenant_id, UUID) else UUID(str(tenant_id))
    except ValueError:
        return short(tenant_id)
    return tenants.get(key) or short(tenant_id)


def options(values: list[str]) -> list[tuple[str, str]]:
    return [(v, v) for v in values]


def tenant_options(tenants: dict[Any, str]) -> list[tuple[str, str]]:
    """(id, name) pairs by name, for a tenant filter."""
    return sorted(((str(k), v) for k, v in tenants.items()), key=lambda kv: kv[1])


FILTERS = {"when": when, "duration": duration, "ago": ago, "number": number, "short": short,
           "plural": plural}
GLOBALS = {"JOB_STATUSES": STATUSES, "EMAIL_STATUSES": EMAIL_STATUSES,
           "tenant_name": tenant_name, "query": query,
           "options": options, "tenant_options": tenant_options}
