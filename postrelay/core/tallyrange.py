"""The range a tally round takes: the closed periods after its mark, within its catch-up
window, a bounded number at a time. Shared by the done rollup (queue) and the email hour
tally (orchestrator), whose statements differ and whose rounds do not.

    took = tally_range(mark.until, mark.cutoff, unit=MINUTE, catch_up=HOUR, most=10)
    if took is not None:
        start, end = took
"""

from __future__ import annotations

from datetime import datetime, timedelta


def tally_range(until: datetime | None, cutoff: datetime, *, unit: timedelta,
                catch_up: timedelta, most: int) -> tuple[datetime, datetime] | None:
    """[start, end) from the mark `until` (None: never tallied) to the `cutoff` (the start of
    the last period that has closed), no earlier than `catch_up` before the cutoff and at
    most `most` units long; None when nothing is left to tally."""
    earliest = cutoff - catch_up
    start = earliest if until is None else max(until, earliest)
    end = min(cutoff, start + most * unit)
    return (start, end) if start < end else None
