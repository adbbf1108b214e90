"""Recording whose transaction loses to a concurrent one (PostgreSQL ends it as a deadlock,
40P01) runs again from the start: a webhook delivery is answered 200, one that keeps losing
a 503 the provider retries (never a 500) with nothing of it written; the inbound
receiver's inbox message is recorded, and the deadlock is not counted against it."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.ext.asyncio import create_async_engine

from postrelay.core.db import sqlalchemy_url
from postrelay.orchestrator.feedback import Feedback, SuppressionPolicy
from postrelay.orchestrator.feedback.inbox import InboxProcessor
from postrelay.orchestrator.feedback.intake import Intake
from postrelay.orchestrator.feedback.sendgrid import sendgrid_reports
from postrelay.orchestrator.feedback.webhook import WebhookUnavailableError, record_batch
from tests.feedback.conftest import Look, insert_log
from tests.feedback.test_webhook_concurrency import served  # noqa: F401 (a fixture)
from tests.feedback.test_webhook_sendgrid import URL, signed

ANN, BOB = "ann@example.com", "bob@example.com"


def two_events(message_id: str) -> list[dict[str, Any]]:
    return [{"smtp-id": message_id, "timestamp": 1700000000, "email": address,
             "event": "bounce", "type": "bounce", "status": "5.1.1",
             "reason": "550 5.1.1 no such user", "sg_event_id": f"conflict-{address}"}
            for address in (ANN, BOB)]


def deadlocked(engine: Engine, keys: list[str], record: Callable[[], Any],
               *closers: Callable[[Connection], object]) -> Any:
    """What `record` returns (or raises) when its transaction meets another that holds the
    feedback row it inserts last, and then (each time `record` waits for it again) asks for
    what `record` holds: the feedback row it inserted first, then each of `closers`. Each
    is a deadlock, in which PostgreSQL ends `record`'s transaction (the other one waits 20 s
    before it looks). The other one then rolls back."""
    low, high = sorted(keys)
    done: list[Any] = []

    def run() -> None:
        try:
            done.append(record())
        except Exception as exc:  # noqa: BLE001 (handed to the test)
            done.append(exc)

    insert = text("INSERT INTO mdm.aa_email_feedback (kind, source, dedupe_key) "
                  "VALUES ('delivered', 'test', :key)")
    with engine.connect() as other:
        other.exec_driver_sql("SET deadlock_timeout = '20s'")
        other.execute(insert, {"key": high})
        thread = threading.Thread(target=run)
        thread.start()
        for close in (lambda conn: conn.execute(insert, {"key": low}), *closers):
            deadline = time.monotonic() + 20
            while not waiting_for(engine, other):  # `record` waits for what `other` holds
                assert time.monotonic() < deadline, "the recording never waited"
                time.sleep(0.01)
            close(other)  # returns once `record`'s transaction ended
        other.rollback()
    thread.join(30)
    return done[0]


def waiting_for(engine: Engine, holder: Any) -> bool:
    """Whether a backend waits for a lock `holder` (a connection) holds. Asked on a
    connection of its own: pg_stat_activity is read once per transaction."""
    pid = holder.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    with engine.connect() as conn:
        return bool(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"),
            {"pid": pid}).scalar_one())


def test_a_delivery_that_meets_a_deadlock_is_recorded_again_and_answered_200(
        served: str, engine: Engine, tenant: uuid.UUID, look: Look,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, recipients=(ANN, BOB))
    events = two_events(sent["message_id"])
    keys = [f.dedupe_key() for f in sendgrid_reports(events)[0]]
    with httpx.Client(base_url=served, timeout=60) as client:
        answer = deadlocked(engine, keys, lambda: client.post(URL, **signed(events)))
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"]["recorded"] == 2
    assert sorted(r["source_event_id"] for r in look.feedback()) == [
        f"conflict-{ANN}", f"conflict-{BOB}"]
    assert set(look.suppressed(tenant)) == {(ANN, ""), (BOB, "")}
    assert len(look.events()) == 2
    retried = [r for r in caplog.records if r.getMessage().startswith(
        "postrelay.db.conflict_retried")]
    assert [r.fields["sqlstate"] for r in retried] == ["40P01"]  # type: ignore[attr-defined]


def test_a_delivery_that_keeps_losing_is_unavailable_and_writes_nothing(
        engine: Engine, tenant: uuid.UUID, look: Look) -> None:
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, recipients=(ANN, BOB))
    reports = sendgrid_reports(two_events(sent["message_id"]))[0]
    failed = deadlocked(engine, [f.dedupe_key() for f in reports],
                        lambda: record_batch(engine, reports, SuppressionPolicy(), attempts=1))
    assert isinstance(failed, WebhookUnavailableError), failed
    assert "lost to concurrent ones 1 times (SQLSTATE 40P01)" in str(failed)
    assert (look.feedback(), look.suppressed(tenant), look.events()) == ([], {}, [])


def test_an_inbox_message_whose_recording_meets_deadlocks_is_not_blamed_for_them(
        database_url: str, engine: Engine, tenant: uuid.UUID, look: Look,
        caplog: pytest.LogCaptureFixture) -> None:
    """Its batch loses once; taken again on its own, it loses again (the other holds the
    inbox row too). Counted as the message's failure, that was an attempt of its five and
    a backoff; after five such, a bounce kept only as `unparsed`."""
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, recipients=(ANN, BOB))
        inbox_id = conn.execute(text(
            "INSERT INTO mdm.aa_feedback_inbox (envelope_to, raw) "
            "VALUES (ARRAY['b@bounces.example'], 'a DSN') RETURNING id")).scalar_one()
    reports = [Feedback(kind="bounced", source="mail", recipient=address, status="5.1.1",
                        log_id=sent["id"], source_event_id=f"dsn-{address}")
               for address in (ANN, BOB)]

    async def process() -> int:
        receiver = create_async_engine(sqlalchemy_url(database_url), pool_pre_ping=False)
        try:
            inbox = InboxProcessor(receiver, lambda to, raw: reports, SuppressionPolicy())
            return await inbox.process_once() + await inbox.process_once()
        finally:
            await receiver.dispose()

    lock_row = text("SELECT FROM mdm.aa_feedback_inbox WHERE id = :id FOR UPDATE")
    deadlocked(engine, [f.dedupe_key() for f in reports], lambda: asyncio.run(process()),
               lambda conn: conn.execute(lock_row, {"id": inbox_id}))
    while look.rows("SELECT id FROM mdm.aa_feedback_inbox WHERE attempts = 0"):
        asyncio.run(process())  # what the other held is free again: recorded now
    assert look.rows("SELECT * FROM mdm.aa_feedback_inbox") == []
    assert sorted(r["source_event_id"] for r in look.feedback()) == [
        f"dsn-{ANN}", f"dsn-{BOB}"]
    assert set(look.suppressed(tenant)) == {(ANN, ""), (BOB, "")}
    assert not [r for r in caplog.records if "message_failed" in r.getMessage()]


def test_a_batch_taken_again_after_a_deadlock_is_counted_once_by_the_intake(
        database_url: str, engine: Engine, tenant: uuid.UUID, look: Look) -> None:
    """The intake holds new mail while its backlog is high: a batch counted twice lowered
    the backlog by rows the processor had not taken."""
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, recipients=(ANN, BOB))
        for _ in range(2):
            conn.execute(text("INSERT INTO mdm.aa_feedback_inbox (envelope_to, raw) "
                              "VALUES (ARRAY['b@bounces.example'], 'a DSN')"))
    reports = [Feedback(kind="bounced", source="mail", recipient=address, status="5.1.1",
                        log_id=sent["id"], source_event_id=f"dsn-{address}")
               for address in (ANN, BOB)]
    intake = Intake()
    intake.stored(5)

    async def process() -> int:
        receiver = create_async_engine(sqlalchemy_url(database_url), pool_pre_ping=False)
        try:
            inbox = InboxProcessor(receiver, lambda to, raw: reports, SuppressionPolicy(),
                                   batch=1, intake=intake)
            return await inbox.process_once()
        finally:
            await receiver.dispose()

    assert deadlocked(engine, [f.dedupe_key() for f in reports],
                      lambda: asyncio.run(process())) == 1
    assert intake.backlog == 4
    assert len(look.rows("SELECT id FROM mdm.aa_feedback_inbox")) == 1


def test_giving_a_message_up_runs_again_after_a_deadlock(
        database_url: str, engine: Engine, look: Look,
        caplog: pytest.LogCaptureFixture) -> None:
    """Its last attempt failed; the transaction that keeps it as `unparsed` meets a
    deadlock and runs again, rather than leaving the message for another round of
    failures."""
    with engine.begin() as conn:
        inbox_id = conn.execute(text(
            "INSERT INTO mdm.aa_feedback_inbox (envelope_to, raw, attempts) "
            "VALUES (ARRAY['b@bounces.example'], 'a DSN', 4) RETURNING id")).scalar_one()
    kept = given_up_key(inbox_id)

    def unreadable(to: list[str], raw: bytes) -> list[Feedback]:
        raise ValueError("no report here")

    async def process() -> int:
        receiver = create_async_engine(sqlalchemy_url(database_url), pool_pre_ping=False)
        try:
            return await InboxProcessor(receiver, unreadable, SuppressionPolicy(),
                                        max_attempts=5).process_once()
        finally:
            await receiver.dispose()

    lock_row = text("SELECT FROM mdm.aa_feedback_inbox WHERE id = :id FOR UPDATE")
    # The other transaction holds the `unparsed` row's key, then asks for the inbox row.
    deadlocked(engine, ["0" * 64, kept], lambda: asyncio.run(process()),
               lambda conn: conn.execute(lock_row, {"id": inbox_id}))
    assert look.rows("SELECT * FROM mdm.aa_feedback_inbox") == []
    assert look.rows("SELECT kind, dedupe_key FROM mdm.aa_email_feedback") == [
        {"kind": "unparsed", "dedupe_key": kept}]
    retried = [r for r in caplog.records if r.getMessage().startswith(
        "postrelay.db.conflict_retried")]
    assert [r.fields["what"] for r in retried] == [  # type: ignore[attr-defined]
        "feedback.inbox_failed"]


def given_up_key(inbox_id: uuid.UUID) -> str:
    return Feedback(kind="unparsed", source="mail",
                    source_event_id=f"inbox:{inbox_id}").dedupe_key()
