"""An attempt stopped while the SMTP server had its message logs `unknown`; the next attempt
follows the template's policy. A lost worker's attempt is logged under its own id."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from postrelay.orchestrator.attempts import attempt_log_id
from postrelay.queue.maintenance.rescuer import Rescuer
from postrelay.testing import drop_after_data, slow
from tests.orchestrator.conftest import eventually


async def stop_during_data(rig, address: str, job_id) -> None:  # noqa: ANN001
    """Stop the worker (grace 0.5 s) while the server takes 3 s to answer."""
    rig.sink.handler.rules = [(address, slow(3.0))]
    await rig.start(grace_secs=0.5)
    await eventually(lambda: rig.job(job_id)["status"] == "running")
    await asyncio.sleep(1.0)  # the message is with the server, which has not answered
    stopped, registry = rig.workers.pop()
    await stopped.stop()
    for close in registry.closers:
        await close()
    rig.sink.handler.rules = []


async def test_a_message_stopped_at_the_server_is_unknown_then_resent(rig, tenant, sink):
    job_id = rig.enqueue(tenant)
    await stop_during_data(rig, "ann@example.com", job_id)
    [row] = rig.log(job_id)
    assert row["status"] == "unknown" and "whether it was accepted" in row["error"]
    assert rig.job(job_id)["status"] == "pending"  # handed back at shutdown, uncounted

    await rig.start()
    await rig.settle(job_id)
    assert rig.job(job_id)["status"] == "done"
    assert [r["status"] for r in rig.log(job_id)] == ["unknown", "sent"]


async def test_a_held_template_waits_for_an_operator_after_an_unknown_outcome(
        rig, tenant, sink):
    from postrelay.queue.admin import dlq_retry

    job_id = rig.enqueue(tenant, to=["billing@example.com"], template="invoice")
    await stop_during_data(rig, "billing@example.com", job_id)
    await rig.start()
    await rig.settle(job_id)
    assert rig.job(job_id)["status"] == "dlq"
    assert "held for an operator" in rig.job(job_id)["last_error"]
    assert [r["status"] for r in rig.log(job_id)] == ["unknown"]

    with rig.engine.begin() as conn:
        dlq_retry(conn, job_id, actor="operator")
    await rig.settle(job_id)
    assert rig.job(job_id)["status"] == "done"
    assert [r["status"] for r in rig.log(job_id)] == ["unknown", "sent"]


async def test_a_lost_workers_attempt_is_logged_under_the_id_it_would_have_used(
        rig, tenant, sink):
    """The rescuer's audit row names the lost claim; the next attempt logs it `unknown`
    under the id that attempt's VERP address carried, and resends (the default policy)."""
    job_id = rig.enqueue(tenant)
    with rig.engine.begin() as conn:  # claimed by a worker that then died
        claimed_at = conn.execute(text(
            "UPDATE mdm.aa_job SET status = 'running', attempts = 1, claimed_by = 'gone', "
            "claimed_at = now() - interval '1 hour' WHERE id = :id RETURNING claimed_at"),
            {"id": job_id}).scalar_one()
    rescued = await Rescuer(rig.async_engine, lease_secs=60, actor="test").run_once()
    assert rescued.pending == 1
    await rig.start()
    await rig.settle(job_id)
    rows = rig.log(job_id)
    assert [(r["attempt"], r["status"]) for r in rows] == [(1, "unknown"), (2, "sent")]
    assert rows[0]["id"] == attempt_log_id(job_id, claimed_at)
    assert sink.handler.count_for("ann@example.com") == 1


@pytest.mark.parametrize("claimed_at", ["infinity", "-infinity"])
async def test_a_hand_written_claim_at_an_infinity_is_rescued_and_the_message_sent(
        rig, tenant, sink, claimed_at):
    """SQL by hand marked the job running with a claim time no claim has: at `infinity` it
    was never stale, and at `-infinity` its rescue named that time as the lost claim's, which
    the next attempt could not read, so it failed every attempt. A lost attempt without a
    moment is logged `unknown` under an id of its own; the message is sent once."""
    job_id = rig.enqueue(tenant)
    with rig.engine.begin() as conn:
        conn.execute(text(
            "UPDATE mdm.aa_job SET status = 'running', attempts = 1, claimed_by = 'gone', "
            "claimed_at = CAST(:at AS timestamptz) WHERE id = :id"),
            {"id": job_id, "at": claimed_at})
    rescued = await Rescuer(rig.async_engine, lease_secs=60, actor="test").run_once()
    assert rescued.pending == 1
    await rig.start()
    await rig.settle(job_id)
    assert rig.job(job_id)["status"] == "done"
    assert [(r["attempt"], r["status"]) for r in rig.log(job_id)] == [(1, "unknown"),
                                                                      (2, "sent")]
    assert sink.handler.count_for("ann@example.com") == 1


async def test_an_outcome_lost_with_the_server_is_unknown_when_the_worker_hands_it_back(
        rig, tenant, sink):
    """Outcomes commit without waiting for the disk: a server crash can lose one after the
    worker saw its commit, leaving the job running under a live worker that does not hold
    it. The worker hands it back as a rescue naming the claim, so the next attempt logs the
    lost one `unknown` under its own id before sending again."""
    job_id = rig.enqueue(tenant)
    worker = await rig.start()
    worker.stop_claiming()  # as if it had run the job and its outcome had been lost
    with rig.engine.begin() as conn:
        claimed_at = conn.execute(text(
            "UPDATE mdm.aa_job SET status = 'running', attempts = 1, claimed_by = :w, "
            "claimed_at = now() - interval '1 hour' WHERE id = :id RETURNING claimed_at"),
            {"id": job_id, "w": worker.id}).scalar_one()
    assert (await worker.heartbeat.run_once()).orphans_released == 1
    await rig.start()
    await rig.settle(job_id)
    rows = rig.log(job_id)
    assert [r["status"] for r in rows] == ["unknown", "sent"]
    assert rows[0]["id"] == attempt_log_id(job_id, claimed_at)


async def test_a_connection_dropped_after_the_message_went_holds_a_held_template(
        rig, tenant, sink):
    """The server kept the message and hung up before answering: the answer is lost, not
    refused. Logged `deferred`, the retry sent a second invoice although the template
    holds on an unknown outcome; logged `unknown`, the retry holds it for an operator."""
    from postrelay.queue.admin import dlq_retry

    sink.handler.rules = [("billing@example.com", drop_after_data())]
    job_id = rig.enqueue(tenant, to=["billing@example.com"], template="invoice")
    await rig.start()
    await rig.settle(job_id)
    assert rig.job(job_id)["status"] == "dlq"
    assert "held for an operator" in rig.job(job_id)["last_error"]
    [row] = rig.log(job_id)
    assert row["status"] == "unknown" and "not known" in row["error"]
    assert sink.handler.count_for("billing@example.com") == 1

    sink.handler.rules = []
    with rig.engine.begin() as conn:
        dlq_retry(conn, job_id, actor="operator")
    await rig.settle(job_id)
    assert rig.job(job_id)["status"] == "done"
    assert [r["status"] for r in rig.log(job_id)] == ["unknown", "sent"]


async def test_a_message_stopped_while_waiting_for_a_connection_is_not_unknown(
        rig, tenant, sink):
    """With one connection, busy with a slow server, the second message waits for it. A
    shutdown then stopped it before anything went, but it was logged `unknown`, and its
    template (which holds on an unknown outcome) waited for an operator in the DLQ."""
    from postrelay.orchestrator import SmtpConfig, SmtpPool

    await rig.pool.close()
    rig.pool = SmtpPool(SmtpConfig(host=sink.host, port=sink.port, pool_size=1,
                                   timeout_secs=5.0))
    busy = rig.enqueue(tenant, to=["slow@example.com"])
    waiting = rig.enqueue(tenant, to=["billing@example.com"], template="invoice")
    await stop_during_data(rig, "slow@example.com", busy)
    assert rig.job(waiting)["status"] == "pending"
    [row] = rig.log(waiting)
    assert row["status"] == "deferred" and "not sent" in row["error"]
    assert [r["status"] for r in rig.log(busy)] == ["unknown"]

    await rig.start()
    await rig.settle(busy, waiting)
    assert rig.job(waiting)["status"] == "done"  # sent, not held for an operator
    assert [r["status"] for r in rig.log(waiting)] == ["deferred", "sent"]
    assert sink.handler.count_for("billing@example.com") == 1


async def test_a_message_cancelled_at_the_server_is_logged_unknown(rig, tenant, sink):
    """An operator's cancel of a job whose message the server has: the job is `failed`
    by the cancel, and the attempt the run recorded as it stopped is in the log all the
    same (a DSN for it finds its row; an operator sees it may have gone)."""
    from postrelay.orchestrator import cancel_job

    job_id = rig.enqueue(tenant)
    rig.sink.handler.rules = [("ann@example.com", slow(3.0))]
    await rig.start()
    await eventually(lambda: rig.job(job_id)["status"] == "running")
    await asyncio.sleep(1.0)  # the message is with the server, which has not answered
    with rig.engine.begin() as conn:
        assert cancel_job(conn, job_id, actor="ops:alice").was == "running"
    await eventually(lambda: rig.log(job_id) != [])
    [row] = rig.log(job_id)
    assert row["status"] == "unknown" and "whether it was accepted" in row["error"]
    assert rig.job(job_id)["status"] == "failed"
