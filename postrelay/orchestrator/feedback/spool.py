"""The inbound receiver's durable inbox writes: each accepted message (its raw bytes and
RCPT TO list) is stored in aa_feedback_inbox, group-committed with the messages that arrived
meanwhile (one COPY and one commit per batch, one transaction at a time), and its SMTP
session answers 250 once that commit is flushed to the WAL.

    spool = InboxSpool(async_engine, on_commit=processor.wake)
    await spool.store(["bounce-…@bounces.acme.example"], raw)  # returns once durable

Parsing and recording follow in feedback/inbox.py, off the SMTP dialogue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.bulkcopy import Copy, copy_rows_async
from postrelay.orchestrator.feedback.groupcommit import MAX_MESSAGES, Batches, held_psycopg
from postrelay.orchestrator.feedback.queries import FEEDBACK_SQL

# The columns of feedback_inbox_copy_in, in order.
INBOX_COPY_TYPES = ("text[]", "bytea")
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
        copy = Copy(FEEDBACK_SQL["feedback_inbox_copy_in"].text, INBOX_COPY_TYPES, messages)
        async with held_psycopg(self.engine) as raw, raw.transaction():
            await copy_rows_async(raw, copy)
        self.on_commit()
        return [None] * len(messages)
