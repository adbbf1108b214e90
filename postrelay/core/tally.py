"""Tallies of closed periods, each counted once behind a mark: the shape the done rollup
(queue/maintenance/rollup.py, done jobs per minute) and the email hour tally
(orchestrator/email_hours.py, log rows per hour) share. Each brings its own statements:

    mark    locks the mark's one row (creating it) and returns `until` (every period before
            it is tallied; NULL: none yet) and `cutoff` (the start of the period `margin`
            ago: the last one that has closed), from :now and :margin_secs
    tally   counts [:start, :end) into the tally, replacing what it held, and moves the mark
            to :end; returns the rows counted
    delete  removes the tallied periods before :before

    counted = await tally_round(engine, DONE_MINUTES, now=None)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import TextClause
from sqlalchemy.ext.asyncio import AsyncEngine


@dataclass(frozen=True, slots=True)
class Tally:
    unit: timedelta  # the period counted
    margin: timedelta  # how long after a period ends it is counted
    catch_up: timedelta  # how far before the cutoff a round reaches back
    most: int  # periods a round takes at most
    keep: timedelta  # how long tallied periods are kept
    mark: TextClause
    tally: TextClause
    delete: TextClause
    params: dict[str, Any] = field(default_factory=dict)  # the tally statement's own


@dataclass(frozen=True, slots=True)
class Counted:
    periods: int  # periods tallied this round
    rows: int  # what they counted
    until: datetime | None  # the mark: every period before it is tallied


async def tally_round(engine: AsyncEngine, tally: Tally, *,
                      now: datetime | None = None) -> Counted:
    """Tally the periods that have closed since the mark, up to `tally.most`, in one
    transaction. `now` defaults to the database's clock."""
    async with engine.begin() as conn:
        mark = (await conn.execute(tally.mark, {
            "now": now, "margin_secs": tally.margin.total_seconds()})).one()
        took = tally_range(mark.until, mark.cutoff, unit=tally.unit,
                           catch_up=tally.catch_up, most=tally.most)
        if took is None:
            return Counted(0, 0, mark.until)
        start, end = took
        rows = (await conn.execute(tally.tally, {
            "start": start, "end": end, **tally.params})).scalar_one()
        await conn.execute(tally.delete, {"before": end - tally.keep})
    return Counted(round((end - start) / tally.unit), int(rows), end)


def tally_range(until: datetime | None, cutoff: datetime, *, unit: timedelta,
                catch_up: timedelta, most: int) -> tuple[datetime, datetime] | None:
    """[start, end) from the mark `until` (None: never tallied) to the `cutoff`, no
    earlier than `catch_up` before the cutoff and at most `most` units long; None when
    nothing is left to tally."""
    earliest = cutoff - catch_up
    start = earliest if until is None else max(until, earliest)
    end = min(cutoff, start + most * unit)
    return (start, end) if start < end else None
