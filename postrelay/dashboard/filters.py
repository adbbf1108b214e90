"""Jinja2 filters and globals: times, durations, numbers and ids as the pages show them,
and `finalize`, the hook every printed value goes through (bidi isolation).

All times are shown in UTC, as cron schedules and the CLI use it.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from markupsafe import Markup

from postrelay.dashboard.queries import COUNTED, EMAIL_STATUSES, MAX_PAGE
from postrelay.queue import STATUSES


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


def percent(value: float | None) -> str:
    """0.25% (two decimals: a complaint rate of 0.1% is the line providers draw)."""
    return "—" if value is None else f"{value * 100:.2f}%"


def short(value: UUID | str | None) -> str:
    """The last 8 characters of an id; the full id is in the link and its title. Ids are
    time-ordered (core/ids.py), so the first characters are shared by every row made within
    the same minute, while the last ones are random."""
    return "—" if value is None else str(value)[-8:]


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


def addresses(values: list[str | None] | None) -> str:
    """A row's addresses joined, a NULL among them (SQL written by hand: postrelay writes
    none) as "-", as the CLI shows it."""
    return ", ".join("-" if value is None else value for value in values or ())


def options(values: list[str]) -> list[tuple[str, str]]:
    return [(v, v) for v in values]


def tenant_options(tenants: dict[Any, str]) -> list[tuple[str, str]]:
    """(id, name) pairs by name, for a tenant filter."""
    return sorted(((str(k), v) for k, v in tenants.items()), key=lambda kv: kv[1])


# --- bidirectional text ----------------------------------------------------------------
#
# Tenant-supplied values (display names, subjects, template names, error texts, payloads)
# are shown beside each other and beside the page's own words. Two things could reorder
# what surrounds them: the explicit bidi controls (an RLO turns "Acme <a@evil.example>" into
# something that reads as another address), and right-to-left letters, which pull the
# neutral characters around them (spaces, "<", ",", digits) into their run.
#
# Every `{{ value }}` therefore goes through `finalize` (templates_environment sets it as
# Jinja's finalize hook, so no template can forget it):
# - each bidi control (U+202A–U+202E, U+2066–U+2069, U+200E, U+200F, U+061C) is replaced
#   by a visible, inert `[U+202E]`, in text and in attributes alike;
# - a value holding right-to-left text is wrapped in <bdi>, which isolates it: it is laid
#   out on its own, with the direction of its first strong letter, and cannot move the
#   page's text or the next value.
# Where markup cannot go (an attribute value, <textarea>, <option>, <title>), templates
# write `{{ value|text }}`: neutralised, not wrapped. tests/dashboard/test_bidi.py renders
# every page with such values and checks both, and that no <bdi> landed in an attribute.

BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_RTL_BLOCKS = ((0x0590, 0x08FF), (0xFB1D, 0xFDFF), (0xFE70, 0xFEFF), (0x10800, 0x10FFF),
               (0x1E800, 0x1EFFF))
# Every character of a right-to-left class (R, AL) or an Arabic number (AN), all of which
# live in these blocks.
_RTL = re.compile("[" + "".join(
    re.escape(chr(c)) for start, end in _RTL_BLOCKS for c in range(start, end + 1)
    if unicodedata.bidirectional(chr(c)) in ("R", "AL", "AN")) + "]")


class PlainText(str):
    """A value neutralised for a context that cannot hold markup (see `text`)."""

    __slots__ = ()


def neutralise(value: str) -> str:
    """`value` with each bidi control replaced by a visible `[U+XXXX]`."""
    return BIDI_CONTROLS.sub(lambda m: f"[U+{ord(m[0]):04X}]", value)


def text(value: Any) -> PlainText:
    """For attribute values, <textarea>, <option> and <title>: neutralised, not isolated.
    (Markup, such as a rendered block, is reduced to its text first.)"""
    if isinstance(value, Markup):
        value = value.striptags()
    return PlainText(neutralise("" if value is None else str(value)))


def finalize(value: Any) -> Any:
    """Jinja's finalize hook: every printed value, before autoescaping."""
    if type(value) is str:
        if value.isascii():  # the common case: nothing can reorder
            return value
        shown = neutralise(value)
        if _RTL.search(shown):
            return Markup("<bdi>%s</bdi>") % shown  # (escaped by Markup's %)
        return shown
    if isinstance(value, PlainText):
        return str(value)
    if isinstance(value, Markup):  # a macro's output or a filter's markup: already finalized
        return value if value.isascii() else Markup(neutralise(value))
    if isinstance(value, str):  # a str subclass, e.g. a StrEnum
        return finalize(str(value))
    return value


FILTERS = {"text": text, "addresses": addresses, "when": when, "duration": duration,
           "ago": ago, "number": number, "short": short, "plural": plural, "percent": percent}
GLOBALS = {"JOB_STATUSES": STATUSES, "COUNTED_STATUSES": COUNTED,
           "EMAIL_STATUSES": EMAIL_STATUSES, "MAX_PAGE": MAX_PAGE,
           "tenant_name": tenant_name, "query": query,
           "options": options, "tenant_options": tenant_options}
