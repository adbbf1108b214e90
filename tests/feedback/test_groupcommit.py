"""The inbound receiver's group commit: messages that arrive while one commit is under way
are stored together in the next (InboxSpool, on a real PostgreSQL), each caller is answered
once its own item is committed, and an item that cannot be committed fails alone
(Batches)."""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from postrelay.orchestrator.feedback.groupcommit import Batches
from postrelay.orchestrator.feedback.spool import InboxSpool


async def test_messages_arriving_together_are_stored_in_one_commit(engine, async_engine):
    commits: list[int] = []
    spool = InboxSpool(async_engine, on_commit=lambda: commits.append(1))
    mails = [([f"bounce-{i}@bounces.example"], f"Subject: {i}\r\n\r\nbody\r\n".encode())
             for i in range(6)]
    try:
        await asyncio.gather(*(spool.store(to, raw) for to, raw in mails))
    finally:
        await spool.close()
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT envelope_to, raw FROM mdm.aa_feedback_inbox")).all()
    assert sorted((list(to), bytes(raw)) for to, raw in rows) == sorted(mails)
    assert len(commits) < len(mails)


class _Doubling(Batches[int, int]):
    """Commits a batch of numbers; a negative one makes its batch fail."""

    def __init__(self) -> None:
        super().__init__(in_flight=1)
        self.batches: list[list[int]] = []

    async def _commit(self, items: list[int]) -> list[int]:
        self.batches.append(items)
        await asyncio.sleep(0.01)
        if any(i < 0 for i in items):
            raise ValueError("negative")
        return [2 * i for i in items]


async def test_one_item_that_cannot_be_committed_fails_alone():
    batches = _Doubling()
    outcomes = await asyncio.gather(*(batches.submit(i) for i in (1, -1, 2, 3)),
                                    return_exceptions=True)
    assert outcomes[0] == 2 and outcomes[2:] == [4, 6]
    assert isinstance(outcomes[1], ValueError)
    assert batches.batches[-4:] == [[1], [-1], [2], [3]]  # the failed batch, one by one


async def test_an_item_submitted_as_the_last_batch_ends_is_committed():
    """A caller answered by the last batch may submit again before that batch's task has
    ended: its item must start a batch of its own, not wait for a task that is over."""
    batches = _Doubling()

    async def answer_then_submit() -> int:
        await batches.submit(1)
        return await batches.submit(2)  # woken by the batch, which ends right after

    assert await asyncio.wait_for(answer_then_submit(), timeout=5.0) == 4
