"""The email hour tally: how many log rows each tenant has per UTC hour and status, tallied
once.

The bounce and complaint rates (`/metrics`, the dashboard's overview, feedback/stats.py)
divide by the messages answered in the last week. Counting those on every read reads a week
of the email log: at a million messages a week, a quarter of a second a page. Instead the
maintenance leader tallies each hour once it has closed (and a margin has passed: a log row
is written with its attempt's start as created_at and commits when the attempt ends) into
mdm.aa_email_hour, and moves a mark past it in the same transaction; the rates sum the
tallied hours and count only the rows after the mark live. Writing a log row costs nothing
more: the tally reads what was written.

An hour is tallied with the statuses its rows had then. Bounces and complaints reported later
are read from the log itself, so a late bounce counts. Feedback that proves an `unknown`
outcome `sent` moves the row's count in its tallied hour from `unknown` to `sent` (in the
statement that records it, sql/feedback.sql `email_feedback_apply_many`), so that a rate is
always a share of the messages it divides by; it holds the mark's row in share mode to its
commit, so a round never counts that row between the change and the move.

Correctness does not rest on the leader lease: a round locks the mark's row, so a second
leader racing the first waits and then finds the hours tallied, and an hour tallied twice
gets its counts replaced, never added. When no leader ran for a while, the next rounds catch
up the last CATCH_UP (the rates' week), MAX_HOURS_PER_ROUND hours a round. Rows older than
KEEP are deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.tally import Tally, tally_round
from postrelay.core.telemetry import event
from postrelay.orchestrator.queries import EMAIL_SQL
from postrelay.orchestrator.schema import EMAIL_STATUSES

HOUR = timedelta(hours=1)
# Beyond an attempt's own length: SMTP's timeouts are per command, so the longest attempts
# take minutes; one that commits later than this is left out of its hour's tally.
MARGIN = timedelta(minutes=15)
CATCH_UP = timedelta(days=7, hours=1)  # the rates' week, from its first whole hour
MAX_HOURS_PER_ROUND = 6
KEEP = timedelta(days=8)

EMAIL_HOURS = Tally(unit=HOUR, margin=MARGIN, catch_up=CATCH_UP, most=MAX_HOURS_PER_ROUND,
                   keep=KEEP, mark=EMAIL_SQL["email_hour_rollup_mark"],
                   tally=EMAIL_SQL["email_hour_rollup_tally"],
                   delete=EMAIL_SQL["email_hour_delete_before"],
                   params={"statuses": list(EMAIL_STATUSES)})


@dataclass(frozen=True, slots=True)
class TallyResult:
    hours: int  # hours tallied this round
    messages: int  # log rows in them
    until: datetime | None  # the mark: every hour before it is tallied


class EmailHourTally:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def run_once(self, now: datetime | None = None) -> TallyResult:
        """Tally the hours that have closed since the mark, up to MAX_HOURS_PER_ROUND.
        `now` defaults to the database's clock, the one created_at is written with."""
        counted = await tally_round(self.engine, EMAIL_HOURS, now=now)
        if counted.periods:
            event("postrelay.email_hours.tallied", logging.DEBUG, hours=counted.periods,
                  messages=counted.rows, until=counted.until and counted.until.isoformat())
        return TallyResult(counted.periods, counted.rows, counted.until)
