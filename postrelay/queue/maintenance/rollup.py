"""The done rollup: how many jobs were done in each minute, per tenant, tallied once.

The dashboard's overview shows the last hour of done jobs, minute by minute. Counting them
on every refresh reads one index entry per job: during a drain at 2,000 jobs/s, millions
of entries a refresh. Instead the maintenance leader tallies each minute once it has
closed (and a margin has passed, for completions that commit late) into
mdm.aa_job_done_minute, and moves a mark past it in the same transaction; the page sums
the tallied minutes and counts only those after the mark (about the last minute) live.
The job's completion writes nothing more: the tally reads what it wrote.

Correctness does not rest on the leader lease: a round locks the mark's row, so a second
leader racing the first waits and then finds the minutes tallied, and a minute tallied
twice gets its count replaced, never added. The mark only moves forward, and the page
reads the mark and the tallied minutes in one statement, so every minute is counted once,
from the tally or live.

When no leader ran for a while, the next rounds catch up at most the last hour (the
overview's window), MAX_MINUTES_PER_ROUND minutes a round so that a round stays short
beside the rescuer; minutes before that hour stay out of the tally. Rows older than KEEP
are deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.sqlfiles import load_queries
from postrelay.core.tally import Tally, tally_round
from postrelay.core.telemetry import event

ROLLUP_SQL = load_queries("postrelay.queue", "sql/rollup.sql")

MINUTE = timedelta(minutes=1)
# A completion's completed_at is its transaction's start; that transaction is one short
# statement (queue/completer.py) and commits milliseconds later, seconds in a stall. A
# minute is tallied once it ended this long ago. The longer the margin, the more the page
# counts live: at 2,000 jobs/s, 30,000 index entries more per 15 s.
MARGIN = timedelta(seconds=15)
CATCH_UP = timedelta(hours=1)  # the overview's chart: older minutes are not read
MAX_MINUTES_PER_ROUND = 10
KEEP = timedelta(days=1)

DONE_MINUTES = Tally(unit=MINUTE, margin=MARGIN, catch_up=CATCH_UP,
                    most=MAX_MINUTES_PER_ROUND, keep=KEEP,
                    mark=ROLLUP_SQL["job_done_rollup_mark"],
                    tally=ROLLUP_SQL["job_done_rollup_tally"],
                    delete=ROLLUP_SQL["job_done_minute_delete_before"])


@dataclass(frozen=True, slots=True)
class RollupResult:
    minutes: int  # minutes tallied this round
    done: int  # done jobs in them
    until: datetime | None  # the mark: every minute before it is tallied


class DoneRollup:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def run_once(self, now: datetime | None = None) -> RollupResult:
        """Tally the minutes that have closed since the mark, up to MAX_MINUTES_PER_ROUND.
        `now` defaults to the database's clock, the one completed_at is written with."""
        counted = await tally_round(self.engine, DONE_MINUTES, now=now)
        if counted.periods:
            event("postrelay.rollup.tallied", logging.DEBUG, minutes=counted.periods,
                  done=counted.rows, until=counted.until and counted.until.isoformat())
        return RollupResult(counted.periods, counted.rows, counted.until)
