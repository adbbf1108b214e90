"""A job held in the DLQ for an unknown outcome, completed by feedback: the real handler
holds it, feedback proves the message left, and nothing is sent again."""

from __future__ import annotations

from uuid import UUID

from sqlalchemy import text

from postrelay.orchestrator.feedback import Feedback, record_feedback
from postrelay.orchestrator.message import message_id_for
from postrelay.queue.maintenance.rescuer import Rescuer

ADDRESS = "billing@example.com"


async def held_in_dlq(rig, tenant, engine) -> tuple[UUID, str]:
    """An invoice whose worker died after handing it over: rescued, its next attempt logs
    it `unknown` and holds the job in the DLQ. Its job id and Message-ID."""
    job_id = rig.enqueue(tenant, to=[ADDRESS], template="invoice")
    with engine.begin() as conn:
        conn.execute(text(
            "UPDATE mdm.aa_job SET status = 'running', attempts = 1, claimed_by = 'gone', "
            "claimed_at = now() - interval '1 hour' WHERE id = :id"), {"id": job_id})
    assert (await Rescuer(rig.async_engine, lease_secs=60, actor="test").run_once()).pending
    await rig.start()
    await rig.settle(job_id)
    assert rig.job(job_id)["status"] == "dlq"
    return job_id, message_id_for(job_id, "mail.acme.example")


async def test_feedback_for_a_held_message_completes_its_job_without_sending_it_again(
        rig, tenant, sink, engine):
    job_id, message_id = await held_in_dlq(rig, tenant, engine)
    assert [r["status"] for r in rig.log(job_id)] == ["unknown"]

    with engine.begin() as conn:
        done = record_feedback(conn, Feedback(
            kind="delivered", source="mail", recipient=ADDRESS, message_id=message_id,
            source_event_id="<dsn-delivered@mx.example.net>"))
    assert done.completed_job == job_id
    assert rig.job(job_id)["status"] == "done"
    assert [r["status"] for r in rig.log(job_id)] == ["sent"]
    assert sink.handler.count_for(ADDRESS) == 0


async def test_retention_keeps_the_unknown_row_of_a_held_job_for_its_feedback(
        rig, tenant, sink, engine):
    """Email log retention deleted every row older than its window, the `unknown` row of a
    job held in the DLQ too (the DLQ is kept until an operator acts): feedback proving the
    message left then matched nothing, the job stayed held, and a retry sent it again.
    The row goes once its job has (done, or deleted by job retention)."""
    from datetime import timedelta

    from postrelay.core.clock import utcnow
    from postrelay.orchestrator.retention import email_log_delete_batch

    job_id, message_id = await held_in_dlq(rig, tenant, engine)
    with engine.begin() as conn:  # held for longer than the log's window
        conn.execute(text("UPDATE mdm.aa_email_log SET created_at = now() - interval '40 days' "
                          "WHERE job_id = :id"), {"id": job_id})
    before = utcnow() - timedelta(days=30)
    assert await email_log_delete_batch(rig.async_engine, before, 1000) == 0
    assert [r["status"] for r in rig.log(job_id)] == ["unknown"]

    with engine.begin() as conn:
        done = record_feedback(conn, Feedback(
            kind="delivered", source="mail", recipient=ADDRESS, message_id=message_id,
            source_event_id="<dsn-delivered@mx.example.net>"))
    assert done.completed_job == job_id and rig.job(job_id)["status"] == "done"
    assert sink.handler.count_for(ADDRESS) == 0
    assert await email_log_delete_batch(rig.async_engine, before, 1000) == 1  # done: it goes
