"""An attempt whose worker died is logged `unknown` by the next attempt, also when that
attempt cannot send (its template broke meanwhile, an address is refused): the lost one may
have handed its message over, and the email log is where that is told."""

from __future__ import annotations

from sqlalchemy import text

from postrelay.orchestrator.attempts import attempt_log_id
from postrelay.queue.maintenance.rescuer import Rescuer


async def lost_first_attempt(rig, job_id):  # noqa: ANN001, ANN201
    with rig.engine.begin() as conn:  # claimed by a worker that then died
        claimed_at = conn.execute(
            text(
                "UPDATE mdm.aa_job SET status = 'running', attempts = 1, claimed_by = 'gone', "
                "claimed_at = now() - interval '1 hour' WHERE id = :id RETURNING claimed_at"
            ),
            {"id": job_id},
        ).scalar_one()
    rescued = await Rescuer(rig.async_engine, lease_secs=60, actor="test").run_once()
    assert rescued.pending == 1
    return claimed_at


async def test_a_lost_attempt_is_logged_when_the_next_one_fails_on_its_template(rig, tenant, sink):
    job_id = rig.enqueue(tenant)
    claimed_at = await lost_first_attempt(rig, job_id)
    (rig.templates / "welcome" / "body.txt").write_text("Hello {{ usr.name }}")  # broken
    await rig.start()
    await rig.settle(job_id)

    assert rig.job(job_id)["status"] == "dlq"
    rows = rig.log(job_id)
    assert [(r["attempt"], r["status"]) for r in rows] == [(1, "unknown"), (2, "failed")]
    assert rows[0]["id"] == attempt_log_id(job_id, claimed_at)
    assert "usr" in rows[1]["error"]
    assert sink.handler.received == []


async def test_a_lost_attempt_that_was_recorded_sent_still_ends_the_job_done(rig, tenant, sink):
    """The lost attempt's own row says `sent` after all (its worker was slow, not dead):
    a broken template then does not fail the job, and the row stays `sent`."""
    job_id = rig.enqueue(tenant)
    claimed_at = await lost_first_attempt(rig, job_id)
    with rig.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO mdm.aa_email_log (id, tenant_id, job_id, template, from_address, "
                "recipients, to_addresses, cc_addresses, bcc_addresses, message_id, status, "
                "attempt) VALUES (:id, :t, :j, 'welcome', 'noreply@acme.example', "
                "ARRAY['ann@example.com'], ARRAY['ann@example.com'], '{}', '{}', '<m@x>', "
                "'sent', 1)"
            ),
            {"id": attempt_log_id(job_id, claimed_at), "t": tenant, "j": job_id},
        )
    (rig.templates / "welcome" / "body.txt").write_text("Hello {{ usr.name }}")
    await rig.start()
    await rig.settle(job_id)
    assert rig.job(job_id)["status"] == "done"
    assert [(r["attempt"], r["status"]) for r in rig.log(job_id)] == [(1, "sent")]
