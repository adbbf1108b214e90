"""The inbound receiver's durable inbox writes: each accepted message (its raw bytes and
RCPT TO list) is stored in aa_feedback_inbox, group-committed with the messages that arrived
meanwhile (one INSERT, its own transaction, per batch; one at a time), and its SMTP session
answers 250 once that commit is flushed to the WAL.

    spool = InboxSpool(async_engine, on_commit=processor.wake)
    await spool.store(["bounce-…@bounces.acme.example"], raw)  # returns once durable

Parsing and recording follow in feedback/inbox.py, off the SMTP dialogue.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core import jsontext
from postrelay.core.dbcall import psycopg_sql
from postrelay.orchestrator.feedback.groupcommit import MAX_MESSAGES, Batches, held_psycopg
from postrelay.orchestrator.feedback.queries import FEEDBACK_SQL

Message = tuple[list[str], bytes]


class InboxSpool(Batches[Message, None]):
    def __init__(self, engine: AsyncEngine, on_commit: Callable[[], None] = lambda: None,
                 max_messages: int = MAX_MESSAGES) -> None:
        # One transaction at a time: whatever arrives meanwhile makes the next batch.
        super().__init__(max_messages, in_flight=1)
        self.engine = engine
        self.on_commit = on_commit

    async def store(self, envelope_to: Sequence[str], raw: bytes) -> None:
        """Store one message; returns once its commit is flushed, raises if it failed."""
        await self.submit((list(envelope_to), raw))

    async def _commit(self, messages: list[Message]) -> list[None]:
        rows = jsontext.encode_rows([{"to": to, "raw": base64.b64encode(raw).decode()}
                                     for to, raw in messages])
        async with held_psycopg(self.engine) as conn:
            # The statement is its own transaction: no BEGIN and COMMIT round trips. The
            # connection goes back to the pool as it came, for SQLAlchemy's transactions.
            await conn.set_autocommit(True)
            try:
                await conn.execute(psycopg_sql(FEEDBACK_SQL["feedback_inbox_insert"]),
                                   {"rows": rows})
            finally:
                if not conn.closed:
                    await conn.set_autocommit(False)
        self.on_commit()
        return [None] * len(messages)
