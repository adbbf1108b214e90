"""Effects: rows a handler records commit in the transaction of the job's outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sqlalchemy import TextClause, text

from postrelay.core import jsontext
from postrelay.queue import PermanentError, Registry, Snooze, enqueue, record_with_outcome
from postrelay.queue.completer import MAX_REFUSALS
from postrelay.queue.model import Job
from tests.factories import job_row
from tests.integration.test_worker import run_until, status_of
from tests.integration.worker_helpers import as_awaitable, make_worker, wait_until

NOTE = (
    "INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, actor) "
    "SELECT r.job_id, r.tenant_id, 'reindex', {action}, 'test' "
    "FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(job_id uuid, tenant_id uuid, action text)"
)


class AuditNote:
    """Writes an audit row per effect; its first `failures` writes are refused (a NULL
    action)."""

    name = "audit-note"

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls = 0

    def statement(self, rows: Sequence[dict]) -> tuple[TextClause, dict]:
        self.calls += 1
        action = "NULL" if self.calls <= self.failures else "r.action"
        return text(NOTE.format(action=action)), {"rows": jsontext.encode_rows(rows)}


def notes(engine, job_id) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(text(
            "SELECT action FROM mdm.aa_job_audit WHERE job_id = :id AND actor = 'test' "
            "ORDER BY id"), {"id": job_id}).scalars())


async def test_effects_commit_with_every_kind_of_outcome(engine, async_engine, libpq, tenant):
    writer = AuditNote()
    registry = Registry()

    @registry.handler("reindex")
    async def reindex(job: Job) -> None:
        record_with_outcome(writer, {"job_id": job.id, "tenant_id": job.tenant_id,
                                     "action": f"note:{job.payload['end']}"})
        if job.payload["end"] == "dlq":
            raise PermanentError("no")

    with engine.begin() as conn:
        done = enqueue(conn, "reindex", {"end": "done"}, tenant_id=tenant)
        dead = enqueue(conn, "reindex", {"end": "dlq"}, tenant_id=tenant)
    await run_until(async_engine, libpq, registry,
                    lambda: status_of(engine, done) == "done" and status_of(engine, dead) == "dlq")
    assert notes(engine, done) == ["note:done"]
    assert notes(engine, dead) == ["note:dlq"]


async def test_a_failed_effect_write_rolls_back_the_outcome_and_is_retried(
    engine, async_engine, libpq, tenant
):
    writer = AuditNote(failures=2)
    registry = Registry()

    @registry.handler("reindex")
    async def reindex(job: Job) -> None:
        record_with_outcome(writer, {"job_id": job.id, "tenant_id": job.tenant_id,
                                     "action": "note"})

    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {}, tenant_id=tenant)
    await run_until(async_engine, libpq, registry, lambda: status_of(engine, job_id) == "done")
    # Two refused writes left neither the note nor the outcome; the third both.
    assert writer.calls == 3
    assert notes(engine, job_id) == ["note"]
    with engine.connect() as conn:
        assert job_row(conn, job_id)["attempts"] == 1


async def test_a_refused_write_takes_back_the_effects_written_before_it(
    engine, async_engine, libpq, tenant
):
    """The effects and the outcome go to the server in one round trip: an effect written
    ahead of a refused one is rolled back with it, so the retry writes it once."""
    first, second = AuditNote(), AuditNote(failures=1)
    registry = Registry()

    @registry.handler("reindex")
    async def reindex(job: Job) -> None:
        for writer, action in ((first, "first"), (second, "second")):
            record_with_outcome(writer, {"job_id": job.id, "tenant_id": job.tenant_id,
                                         "action": action})

    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {}, tenant_id=tenant)
    await run_until(async_engine, libpq, registry, lambda: status_of(engine, job_id) == "done")
    assert (first.calls, second.calls) == (2, 2)
    assert notes(engine, job_id) == ["first", "second"]


async def test_snooze_does_not_count_the_attempt(engine, async_engine, libpq, tenant):
    registry = Registry()
    runs: list[int] = []

    @registry.handler("reindex")
    async def reindex(job: Job) -> None:
        runs.append(job.attempts)
        if len(runs) < 3:
            raise Snooze(0.01, "resource paused")

    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {}, tenant_id=tenant, max_attempts=1)
    await run_until(async_engine, libpq, registry, lambda: status_of(engine, job_id) == "done")
    assert runs == [1, 1, 1]  # max_attempts 1, yet three runs: snoozes are not attempts


class PoisonNote(AuditNote):
    """Writes an audit row per effect, and refuses (a NULL action) every statement that
    carries a row whose action is "poison"."""

    name = "poison-note"

    def statement(self, rows: Sequence[dict]) -> tuple[TextClause, dict]:
        self.calls += 1
        action = "CASE WHEN r.action = 'poison' THEN NULL ELSE r.action END"
        return text(NOTE.format(action=action)), {"rows": jsontext.encode_rows(rows)}


async def test_an_outcome_the_database_refuses_is_given_up_alone_and_the_rest_go_on(
    engine, async_engine, libpq, tenant
):
    """A row the database will never take fails its statement, and so every outcome
    written with it: the completer writes them one at a time, and the one refused on its
    own MAX_REFUSALS times goes to the DLQ without its effects, saying why."""
    writer = PoisonNote()
    registry = Registry()
    started = asyncio.Event()

    @registry.handler("reindex")
    async def reindex(job: Job) -> None:
        await started.wait()  # the runs end together: their outcomes share a write
        record_with_outcome(writer, {"job_id": job.id, "tenant_id": job.tenant_id,
                                     "action": job.payload["note"]})

    with engine.begin() as conn:
        jobs = [enqueue(conn, "reindex", {"note": note}, tenant_id=tenant)
                for note in ("a", "poison", "b", "c")]
    worker = make_worker(async_engine, libpq, registry)
    await worker.start()
    try:
        await wait_until(lambda: as_awaitable(len(worker.running_ids) == 4))
        started.set()
        await wait_until(lambda: as_awaitable(
            [status_of(engine, j) for j in jobs] == ["done", "dlq", "done", "done"]), timeout=30)
        # The worker writes outcomes as before.
        with engine.begin() as conn:
            later = enqueue(conn, "reindex", {"note": "later"}, tenant_id=tenant)
        await wait_until(lambda: as_awaitable(status_of(engine, later) == "done"))
    finally:
        await worker.stop()
    assert [notes(engine, j) for j in jobs] == [["a"], [], ["b"], ["c"]]
    with engine.connect() as conn:
        error = job_row(conn, jobs[1])["last_error"]
    assert error.startswith(f"the outcome (done) could not be recorded: the database refused "
                            f"it {MAX_REFUSALS} times: NotNullViolation")
    assert "its records (poison-note) were not written" in error
    assert writer.calls > MAX_REFUSALS  # the batch, then each outcome on its own
