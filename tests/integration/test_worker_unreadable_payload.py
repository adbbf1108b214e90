"""A payload jsonb stores and Python cannot read: SQL written by hand (another service's,
in another language) can store an integer of more digits than Python converts, or nesting
deeper than its decoder's recursion. One such row failed the whole claim after it had
committed: it and the jobs claimed with it stayed `running`, and the rescuer handed them
back to be claimed and fail again, for ever."""

from __future__ import annotations

from sqlalchemy import text

from postrelay.queue import Registry
from postrelay.queue.model import Job
from tests.factories import insert_job
from tests.integration.worker_helpers import run_until

HUGE_INTEGER = '{"n": ' + "7" * 5000 + "}"
DEEP = '{"n": ' + "[" * 3000 + "]" * 3000 + "}"


async def test_a_payload_python_cannot_read_is_dead_lettered_and_the_rest_run(
        engine, async_engine, libpq, tenant):
    registry = Registry()
    ran: list[Job] = []

    @registry.handler("reindex")
    async def reindex(job: Job) -> None:
        ran.append(job)

    with engine.begin() as conn:
        good = insert_job(conn, tenant_id=tenant, payload={"n": 1})
        unreadable = {}
        for name, payload in (("huge", HUGE_INTEGER), ("deep", DEEP)):
            unreadable[name] = insert_job(conn, tenant_id=tenant)
            conn.execute(text("UPDATE mdm.aa_job SET payload = CAST(:p AS jsonb) WHERE id = :id"),
                         {"p": payload, "id": unreadable[name]})

    def settled() -> bool:
        with engine.begin() as conn:
            settled = conn.execute(text(
                "SELECT count(*) FROM mdm.aa_job WHERE status IN ('done', 'dlq')")).scalar_one()
        return settled == 3

    await run_until(async_engine, libpq, registry, settled)

    assert [job.id for job in ran] == [good] and ran[0].payload == {"n": 1}
    with engine.begin() as conn:
        assert state(conn, good)["status"] == "done"
        rows = {name: state(conn, job_id) for name, job_id in unreadable.items()}
        for row in rows.values():
            assert row["status"] == "dlq" and row["attempts"] == 1
            assert "the job's payload cannot be read" in row["last_error"]
        assert "5000 digits" in rows["huge"]["last_error"]
        assert "RecursionError" in rows["deep"]["last_error"]
        # Kept as it was, for an operator to mend and retry.
        stored = conn.execute(text("SELECT length(payload::text) FROM mdm.aa_job WHERE id = :id"),
                              {"id": unreadable["huge"]}).scalar_one()
    assert stored == len(HUGE_INTEGER)


def state(conn, job_id):
    """The row without its payload, which the driver cannot read either."""
    return conn.execute(text("SELECT status::text AS status, attempts, last_error "
                             "FROM mdm.aa_job WHERE id = :id"), {"id": job_id}).mappings().one()
