"""The inbound receiver's durable inbox writes: each accepted message (its raw bytes and
RCPT TO list) is stored in aa_feedback_inbox, group-committed with the messages that arrived
meanwhile (one INSERT, its own transaction, per batch; one at a time), and its SMTP session
answers 250 once that commit is flushed to the WAL.

    spool = InboxSpool(async_engine, on_commit=stored)  # stored(6): six messages committed
    await spool.store(["bounce-…@bounces.acme.example"], raw)  # returns once durable

Parsing and recording follow in feedback/inbox.py, off the SMTP dialogue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import psycopg
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core import jsontext
from postrelay.core.dbcall import psycopg_sql
from postrelay.core.heldconn import HeldConnection
from postrelay.orchestrator.feedback.groupcommit import MAX_MESSAGES, Batches
from postrelay.orchestrator.feedback.queries import FEEDBACK_SQL

Message = tuple[list[str], bytes]


class InboxSpool(Batches[Message, None]):
    def __init__(self, engine: AsyncEngine, on_commit: Callable[[int], None] = lambda count: None,
                 max_messages: int = MAX_MESSAGES) -> None:
        # One transaction at a time: whatever arrives meanwhile makes the next batch. So one
        # connection, held in autocommit mode, serves them all without a pool checkout each.
        # Under load a commit also takes the messages whose DATA the loop has just read
        # (groupcommit.TIMER_TICK_SECS): each commit's flush costs the server about as much
        # as storing the messages.
        super().__init__(max_messages, in_flight=1, gather_woken=True)
        self.engine = engine
        self.on_commit = on_commit
        self._held = HeldConnection(engine)

    async def store(self, envelope_to: Sequence[str], raw: bytes) -> None:
        """Store one message; returns once its commit is flushed, raises if it failed."""
        await self.submit((list(envelope_to), raw))

    async def _commit(self, messages: list[Message]) -> list[None]:
        params = {"envelopes": [jsontext.encode_rows(to) for to, _ in messages],
                  "raws": [raw for _, raw in messages]}
        try:
            # The statement is its own transaction: no BEGIN and COMMIT round trips.
            async with self._held.use() as conn:
                await conn.execute(psycopg_sql(FEEDBACK_SQL["feedback_inbox_insert"],
                                               binary=True), params)
        except psycopg.OperationalError:
            # The held connection is dropped; a lost connection rarely goes alone, so the
            # pool's others are replaced too before the batch is retried a message at a time.
            await self.engine.dispose(close=False)
            raise
        self.on_commit(len(messages))
        return [None] * len(messages)

    async def close(self) -> None:
        """Release the held connection (a later store opens another)."""
        await self._held.close()
