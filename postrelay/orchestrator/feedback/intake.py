"""Flow control for `postrelay inbound`: a new message waits while the inbox holds
`high_water` or more messages that this receiver stored and its processor has not yet
taken, for `max_delay_secs` at most, as Postfix's in_flow_delay holds a client while its
queue manager lags.

The SMTP sessions and the processor share one event loop, in which every session gets a
turn for each one the processor gets: with many connections the sessions took nearly all
of it, and the inbox grew for as long as the mail kept coming, its reports (suppressions
among them) recorded only after. Held here, a session gives its turns to the processor
and its sending MTA waits for the 250, so mail is taken in no faster than it is recorded.
The lag inbox.py allows on purpose (a batch waits while mail keeps coming, 0.2 s at most)
stays below the mark at the rates one receiver takes mail in.

The wait is bounded: a processor that cannot record (the database is failing) must not
hold every sender for good; the message is then stored, or refused with 451, as it would
be without this.

    intake = Intake()
    await intake.room()                    # before storing a message
    intake.stored(6)                       # after an inbox commit of 6 messages
    intake.taken(100, drained=False)       # after the processor took a full batch
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from postrelay.core.telemetry import event

# Ten batches: at the processor's pace, a fraction of a second of recording.
HIGH_WATER = 1000
MAX_DELAY_SECS = 1.0  # Postfix's in_flow_delay


class Intake:
    def __init__(self, high_water: int = HIGH_WATER,
                 max_delay_secs: float = MAX_DELAY_SECS) -> None:
        self.high_water = high_water
        self.max_delay_secs = max_delay_secs
        # Stored here and not taken since. Rows another process stored, or left by a
        # crash, are not counted; a take that empties the inbox starts the count afresh.
        self.backlog = 0
        self.held = 0  # messages that waited, since start
        self._open = asyncio.Event()
        self._open.set()
        self._behind = False  # held since the inbox was last found empty: logged once

    async def room(self) -> None:
        """Returns at once unless the backlog is at the mark; then when the processor has
        taken it below, or after max_delay_secs."""
        if self._open.is_set():
            return
        self.held += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._open.wait(), self.max_delay_secs)

    def stored(self, count: int) -> None:
        self.backlog += count
        if self.backlog >= self.high_water and self._open.is_set():
            self._open.clear()
            if not self._behind:
                self._behind = True
                event("postrelay.inbound.intake_held", logging.INFO, backlog=self.backlog)

    def taken(self, count: int, *, drained: bool) -> None:
        """The processor took `count` messages; `drained`: it found fewer than it asked
        for, so nothing stored before is waiting."""
        self.backlog = 0 if drained else max(0, self.backlog - count)
        self._behind = self._behind and not drained
        if self.backlog < self.high_water:
            self._open.set()
