"""Flow control of the inbound receiver (intake.py): new mail waits while the processor lags,
so that the inbox holds no more than the mark plus what the open sessions carry, and no
longer than the bound when the processor cannot record at all."""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.ext.asyncio import create_async_engine

from postrelay.core.db import sqlalchemy_url
from postrelay.orchestrator.feedback import SuppressionPolicy
from postrelay.orchestrator.feedback.inbound import InboundConfig, InboundServer
from postrelay.orchestrator.feedback.intake import Intake
from tests.feedback.conftest import await_inbox_empty
from tests.feedback.test_inbound import deliver, free_port
from tests.feedback.test_inbox import bounces, on_loop


def receiver(database_url: str, return_path, high_water: int,
             delay_secs: float) -> InboundServer:
    engine = create_async_engine(sqlalchemy_url(database_url), pool_pre_ping=False)
    config = InboundConfig(host="127.0.0.1", port=free_port(), max_bytes=1024 * 1024,
                           intake_high_water=high_water, intake_delay_secs=delay_secs)
    return InboundServer(engine, return_path, SuppressionPolicy(), config)


async def until(predicate, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_mail_past_the_mark_waits_until_the_processor_takes_the_backlog(
        database_url, engine, tenant, look, return_path):
    mails = bounces(engine, tenant, return_path, 3)
    server = receiver(database_url, return_path, high_water=2, delay_secs=60.0)
    with server:
        on_loop(server, server.feedback.inbox.stop())  # the processor lags: it takes nothing
        for _, verp, raw in mails[:2]:
            assert (await deliver(server, verp, raw))[0] == 250
        third = asyncio.create_task(deliver(server, *mails[2][1:]))
        await until(lambda: server.feedback.intake.held == 1)
        await asyncio.sleep(0.2)
        assert not third.done()
        assert len(look.rows("SELECT id FROM mdm.aa_feedback_inbox")) == 2

        on_loop(server, server._start_inbox())  # takes the two: the third goes in
        assert (await third)[0] == 250
        await await_inbox_empty(engine)
    assert all(look.log(sent["id"])["delivery"] == "bounced" for sent, _, _ in mails)


async def test_a_processor_that_takes_nothing_holds_each_message_for_the_bound_only(
        database_url, engine, tenant, look, return_path):
    mails = bounces(engine, tenant, return_path, 3)
    server = receiver(database_url, return_path, high_water=1, delay_secs=0.3)
    with server:
        on_loop(server, server.feedback.inbox.stop())
        replies = [await deliver(server, verp, raw) for _, verp, raw in mails]
    assert [code for code, _ in replies] == [250, 250, 250]
    assert server.feedback.intake.held == 2  # the second and the third, stored after 0.3 s
    assert len(look.rows("SELECT id FROM mdm.aa_feedback_inbox")) == 3


async def test_many_sessions_cannot_outrun_a_slow_processor(
        database_url, engine, tenant, look, return_path):
    """A processor that takes a batch only once no mail has come for 0.2 s takes nothing
    while four senders keep the mail coming: without flow control all forty messages pile
    up in the inbox first. Held at the mark, the senders pause, the processor takes what is
    there, and the backlog never passes the mark by more than the sessions in flight."""
    mails = bounces(engine, tenant, return_path, 40)
    server = receiver(database_url, return_path, high_water=5, delay_secs=60.0)
    seen: list[int] = []

    async def sender(share: list) -> None:
        for _, verp, raw in share:
            assert (await deliver(server, verp, raw))[0] == 250
            seen.append(server.feedback.intake.backlog)

    with server:
        inbox = server.feedback.inbox
        inbox.quiet_secs, inbox.defer_secs = 0.2, 60.0
        await asyncio.gather(*(sender(mails[i::4]) for i in range(4)))
        await await_inbox_empty(engine)
    assert max(seen) <= 5 - 1 + 4
    assert server.feedback.intake.held > 0
    assert all(look.log(sent["id"])["delivery"] == "bounced" for sent, _, _ in mails)


async def test_the_count_follows_what_is_stored_and_taken(caplog):
    caplog.set_level(logging.INFO, logger="postrelay")
    intake = Intake(high_water=150, max_delay_secs=60.0)
    intake.stored(100)
    await asyncio.wait_for(intake.room(), 1)  # below the mark
    intake.stored(60)
    waiting = asyncio.create_task(intake.room())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    intake.taken(100, drained=False)  # a full batch: 60 still wait
    await asyncio.wait_for(waiting, 1)
    assert intake.backlog == 60

    intake.stored(200)
    intake.taken(100, drained=False)
    intake.stored(100)  # 260: held again, in the same episode
    assert intake.backlog == 260
    intake.taken(40, drained=True)  # fewer than a batch: the inbox is empty
    assert intake.backlog == 0
    await asyncio.wait_for(intake.room(), 1)
    assert caplog.text.count("postrelay.inbound.intake_held") == 1
    intake.stored(150)
    assert caplog.text.count("postrelay.inbound.intake_held") == 2  # a new episode
