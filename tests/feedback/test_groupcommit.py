"""The inbound receiver's group commit on a real PostgreSQL: messages that arrive together
share a transaction, each is answered with its own results, and one whose reports cannot
be recorded fails alone."""

from __future__ import annotations

import asyncio
import uuid

import psycopg

from postrelay.orchestrator.feedback import Feedback, SuppressionPolicy
from postrelay.orchestrator.feedback.groupcommit import GroupCommit
from tests.feedback.conftest import insert_log


def bounce(message_id: str, recipient: str, event_id: str) -> Feedback:
    return Feedback(kind="bounced", source="mail", recipient=recipient, status="5.1.1",
                    source_event_id=event_id, message_id=message_id)


async def test_messages_arriving_together_are_recorded_and_answered_each(engine, async_engine,
                                                                          tenant,
                                                                          look):
    with engine.begin() as conn:
        sent = [insert_log(conn, tenant_id=tenant, recipients=(f"u{i}@example.com",))
                for i in range(6)]
    group = GroupCommit(async_engine, SuppressionPolicy(), in_flight=1)
    messages = [[bounce(s["message_id"], f"u{i}@example.com", f"dsn-{i}")]
                for i, s in enumerate(sent)]
    messages[5].append(messages[5][0])  # the same report twice in one message
    results = await asyncio.gather(*(group.record(m) for m in messages))
    assert [[r.email_log_id for r in done] for done in results[:5]] == [
        [s["id"]] for s in sent[:5]]
    assert [r.duplicate for r in results[5]] == [False, True]
    assert len(look.feedback()) == 6 and len(look.suppressed(tenant)) == 6


async def test_one_message_that_cannot_be_recorded_fails_alone(engine, async_engine, tenant,
                                                                look):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    group = GroupCommit(async_engine, SuppressionPolicy(), in_flight=1)
    good = [bounce(sent["message_id"], "ann@example.com", "dsn-good")]
    # A tenant that does not exist: the database refuses the row.
    bad = [Feedback(kind="unsubscribe", source="mail", recipient="bob@example.com",
                    tenant_id=uuid.uuid4(), vouched=True, source_event_id="dsn-bad")]
    outcomes = await asyncio.gather(group.record(bad), group.record(good),
                                    return_exceptions=True)
    assert isinstance(outcomes[0], psycopg.errors.ForeignKeyViolation)
    assert outcomes[1][0].email_log_id == sent["id"]
    assert [r["source_event_id"] for r in look.feedback()] == ["dsn-good"]
