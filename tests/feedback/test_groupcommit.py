"""The inbound receiver's group commit: messages that arrive while one commit is under way
are stored together in the next (InboxSpool, on a real PostgreSQL), each caller is answered
once its own item is committed, and an item that cannot be committed fails alone
(Batches)."""

from __future__ import annotations

import asyncio
import socket

import psycopg
import pytest
from sqlalchemy import text

from postrelay.core.dbcall import psycopg_sql
from postrelay.orchestrator.feedback.groupcommit import Batches
from postrelay.orchestrator.feedback.queries import FEEDBACK_SQL
from postrelay.orchestrator.feedback.spool import InboxSpool


async def test_messages_arriving_together_are_stored_in_one_commit(engine, async_engine):
    commits: list[int] = []
    spool = InboxSpool(async_engine, on_commit=commits.append)
    mails = [([f"bounce-{i}@bounces.example"], f"Subject: {i}\r\n\r\nbody\r\n".encode())
             for i in range(6)]
    try:
        await asyncio.gather(*(spool.store(to, raw) for to, raw in mails))
    finally:
        await spool.close()
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT envelope_to, raw FROM mdm.aa_feedback_inbox")).all()
    assert sorted((list(to), bytes(raw)) for to, raw in rows) == sorted(mails)
    assert len(commits) < len(mails) and sum(commits) == len(mails)


class _Doubling(Batches[int, int]):
    """Commits a batch of numbers; a negative one makes its batch fail."""

    def __init__(self, gather_woken: bool = False) -> None:
        super().__init__(in_flight=1, gather_woken=gather_woken)
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


@pytest.mark.parametrize(("gather_woken", "expected"), [
    (True, [[1, 2], [3, 4]]),
    (False, [[1, 2], [3], [4]]),
])
async def test_a_busy_batch_takes_the_items_whose_data_the_loop_just_read(
        gather_woken: bool, expected: list[list[int]]):
    """Once a batch held more than one item, the next is taken one timer tick late: a
    session woken by data that arrived meanwhile (its DATA) submits first and joins that
    batch, instead of waiting for a commit of its own. Without gather_woken it is left for
    the next batch."""
    batches = _Doubling(gather_woken=gather_woken)
    assert await asyncio.gather(batches.submit(1), batches.submit(2)) == [2, 4]
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)

    async def session() -> int:
        await reader.readexactly(1)  # its message arrives
        return await batches.submit(4)

    fourth = asyncio.create_task(session())
    await asyncio.sleep(0)  # the session waits for its data
    third = asyncio.create_task(batches.submit(3))
    await asyncio.sleep(0)  # the third waits, and its batch's task is scheduled
    theirs.send(b".")  # read at the loop's next poll, after that task's first step
    try:
        assert await asyncio.gather(third, fourth) == [6, 8]
    finally:
        writer.close()
        theirs.close()
    assert batches.batches == expected


async def test_an_item_submitted_as_the_last_batch_ends_is_committed():
    """A caller answered by the last batch may submit again before that batch's task has
    ended: its item must start a batch of its own, not wait for a task that is over."""
    batches = _Doubling()

    async def answer_then_submit() -> int:
        await batches.submit(1)
        return await batches.submit(2)  # woken by the batch, which ends right after

    assert await asyncio.wait_for(answer_then_submit(), timeout=5.0) == 4


def test_the_inbox_write_asks_for_its_flush_whatever_its_connection_carries(libpq, clean_db):
    """The commit of an inbox write is what its 250s promise. Behind a transaction pooler
    the receiver's startup setting is dropped, and a server connection may carry another
    client's `SET synchronous_commit = off`: the statement turns it on for its own
    transaction."""
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")  # the careless client's leftover
        with conn.transaction(force_rollback=True):
            conn.execute(psycopg_sql(FEEDBACK_SQL["feedback_inbox_insert"], binary=True),
                         {"envelopes": ['["bounce-x@bounces.acme.example"]'], "raws": [b"x"]})
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)  # its own only
