"""`sending` rows of concurrent attempts are committed together, and one refused row fails
only its own attempt."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
from sqlalchemy import text

from postrelay.orchestrator.sending import SendingBatcher


def sending_row(tenant: uuid.UUID, job_id: uuid.UUID | str) -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "tenant_id": str(tenant), "job_id": str(job_id),
            "event_id": None, "template": "welcome", "template_version": "v1",
            "category": None, "from_address": "noreply@acme.example",
            "recipients": [f"{job_id}@example.com"], "to_addresses": [f"{job_id}@example.com"],
            "cc_addresses": [], "bcc_addresses": [], "subject": "Hi",
            "message_id": f"<{job_id}@acme.example>", "attempt": 1}


def statuses(engine) -> list[str]:  # noqa: ANN001
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT status FROM mdm.aa_email_log")).scalars())


async def test_concurrent_attempts_share_one_round_trip(rig, tenant, async_engine, engine):
    jobs = [rig.enqueue(tenant) for _ in range(20)]
    batcher = SendingBatcher(async_engine)
    starts = await asyncio.gather(*(batcher.begin(sending_row(tenant, j), resend_unknown=True)
                                    for j in jobs))
    assert all(s.sending and not s.earlier and s.unknown_now == 0 for s in starts)
    assert statuses(engine) == ["sending"] * 20
    assert batcher.round_trips <= 2  # one by one would be 20

    # A second attempt of each finds the first one's row: its outcome is unknown.
    again = await asyncio.gather(*(batcher.begin(sending_row(tenant, j), resend_unknown=False)
                                   for j in jobs))
    assert all(s.unknown_now == 1 and not s.sending for s in again)
    assert statuses(engine) == ["unknown"] * 20


async def test_a_refused_row_fails_only_its_own_attempt(rig, tenant, async_engine, engine):
    jobs = [rig.enqueue(tenant) for _ in range(5)]
    batcher = SendingBatcher(async_engine)
    rows = [sending_row(tenant, j) for j in jobs]
    rows.insert(2, sending_row(tenant, uuid.uuid4()))  # no such job: the foreign key refuses
    results = await asyncio.gather(*(batcher.begin(r, resend_unknown=True) for r in rows),
                                   return_exceptions=True)
    assert isinstance(results[2], psycopg.errors.ForeignKeyViolation)
    assert [r.sending for i, r in enumerate(results) if i != 2] == [True] * 5
    assert statuses(engine) == ["sending"] * 5


async def test_a_cancelled_attempt_does_not_stop_the_others(rig, tenant, async_engine, engine):
    jobs = [rig.enqueue(tenant) for _ in range(3)]
    batcher = SendingBatcher(async_engine)
    tasks = [asyncio.create_task(batcher.begin(sending_row(tenant, j), resend_unknown=True))
             for j in jobs]
    await asyncio.sleep(0)  # every attempt is waiting for the write
    tasks[0].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[0], asyncio.CancelledError)
    assert done[1].sending and done[2].sending
    # The cancelled attempt's row was written all the same: its next attempt finds it, as
    # it would after a timeout between this step and the SMTP server.
    assert len(statuses(engine)) == 3

