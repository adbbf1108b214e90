import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from postrelay.core.errors import ValidationError
from postrelay.queue import JobSpec, enqueue, enqueue_async, enqueue_many, enqueue_many_async
from tests.factories import job_row


def count_jobs(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM mdm.aa_job")).scalar_one()


def test_enqueue_writes_only_when_caller_commits(engine, tenant):
    with engine.connect() as conn, conn.begin() as txn:
        enqueue(conn, "reindex", {"a": 1}, tenant_id=tenant)
        txn.rollback()
    assert count_jobs(engine) == 0
    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {"a": 1}, tenant_id=tenant, priority=5, created_by="me")
    with engine.connect() as conn:
        row = job_row(conn, job_id)
    assert row["state"] == "pending"
    assert row["payload"] == {"a": 1}
    assert row["priority"] == 5 and row["attempts"] == 0 and row["max_attempts"] == 8
    assert row["created_by"] == "me"


def test_enqueue_on_a_connection_is_seen_by_sqlalchemy_and_joins_its_autobegun_transaction(
    engine, tenant
):
    # enqueue hands a Connection the driver's SQL (exec_driver_sql): the caller's
    # instrumentation still sees the statement, and commit() commits the job.
    from sqlalchemy import event

    seen: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        with engine.connect() as conn:
            job_id = enqueue(conn, "reindex", {"a": 1}, tenant_id=tenant)
            assert conn.in_transaction()
            conn.commit()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert any("INSERT INTO mdm.aa_job" in s for s in seen)
    with engine.connect() as conn:
        assert job_row(conn, job_id)["state"] == "pending"


def test_enqueue_with_session_and_delay(engine, tenant):
    with Session(engine) as session, session.begin():
        job_id = enqueue(session, "bulk_import", {}, tenant_id=str(tenant), delay=60)
    with engine.connect() as conn:
        row = job_row(conn, job_id)
        now = conn.execute(text("SELECT now()")).scalar_one()
    assert row["available_at"] > now + timedelta(seconds=50)


async def test_enqueue_async_connection_and_run_at(async_engine, tenant, engine):
    run_at = datetime.now(UTC) + timedelta(hours=1)
    async with async_engine.begin() as conn:
        job_id = await enqueue_async(conn, "reindex", {"x": [1, 2]}, tenant_id=tenant,
                                     run_at=run_at)
    with engine.connect() as conn:
        assert abs((job_row(conn, job_id)["available_at"] - run_at).total_seconds()) < 0.01


def test_idempotency_key_returns_first_job(engine, tenant):
    with engine.begin() as conn:
        first = enqueue(conn, "reindex", {"n": 1}, tenant_id=tenant, idempotency_key="k1")
        second = enqueue(conn, "reindex", {"n": 2}, tenant_id=tenant, idempotency_key="k1")
    assert first == second
    assert count_jobs(engine) == 1


def test_racing_idempotent_enqueues_make_one_job(engine, tenant):
    barrier = threading.Barrier(2)
    results: list[uuid.UUID] = []

    def racer() -> None:
        with engine.begin() as conn:
            barrier.wait()
            results.append(enqueue(conn, "reindex", {}, tenant_id=tenant, idempotency_key="race"))

    threads = [threading.Thread(target=racer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and results[0] == results[1]
    assert count_jobs(engine) == 1


def test_racing_idempotent_batches_make_one_job_per_key(engine, tenant):
    # Batches with keys stream in with COPY in a savepoint; the one that finds a key taken
    # (here after waiting for the other transaction's commit) goes by the INSERT instead.
    barrier = threading.Barrier(2)
    results: list[list[uuid.UUID]] = []

    def racer(n: int) -> None:
        specs = [JobSpec("reindex", {"racer": n}, tenant, idempotency_key=key)
                 for key in ("shared-1", f"own-{n}", "shared-2")]
        with engine.begin() as conn:
            barrier.wait()
            results.append(enqueue_many(conn, specs))

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first, second = results
    assert first[0] == second[0] and first[2] == second[2] and first[1] != second[1]
    assert count_jobs(engine) == 4


def test_a_batch_meeting_a_taken_key_keeps_the_rest_of_the_callers_transaction(engine, tenant):
    with engine.begin() as conn:
        taken = enqueue(conn, "reindex", {"n": "old"}, tenant_id=tenant, idempotency_key="k-1")
    with engine.begin() as conn:
        before = enqueue(conn, "reindex", {"n": "before"}, tenant_id=tenant)
        ids = enqueue_many(conn, [JobSpec("reindex", {"n": i}, tenant, idempotency_key=f"k-{i}")
                                  for i in range(3)])
        after = enqueue(conn, "reindex", {"n": "after"}, tenant_id=tenant)
    assert ids[1] == taken and len(set(ids)) == 3
    with engine.connect() as conn:
        assert job_row(conn, before)["payload"] == {"n": "before"}
        assert job_row(conn, after)["payload"] == {"n": "after"}
        assert job_row(conn, taken)["payload"] == {"n": "old"}
        assert [job_row(conn, i)["payload"] for i in (ids[0], ids[2])] == [{"n": 0}, {"n": 2}]
    assert count_jobs(engine) == 5


@pytest.mark.parametrize("autocommit", [False, True])
async def test_a_batch_meeting_a_taken_key_on_psycopg(engine, tenant, libpq, autocommit):
    import psycopg

    with engine.begin() as conn:
        taken = enqueue(conn, "reindex", {}, tenant_id=tenant, idempotency_key="k-1")
    async with await psycopg.AsyncConnection.connect(libpq, autocommit=autocommit) as conn:
        ids = await enqueue_many_async(conn, [JobSpec("reindex", {"n": i}, tenant,
                                                idempotency_key=f"k-{i}") for i in range(3)])
        if not autocommit:
            await conn.commit()
    assert ids[1] == taken and count_jobs(engine) == 3


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"payload": [1, 2]}, "payload"),
        ({"payload": "text"}, "payload"),
        ({"payload": {"x": object()}}, "payload"),
        ({"kind": "no_such_kind"}, "kind"),
        ({"kind": ""}, "kind"),
        ({"tenant_id": None}, "tenant_id"),
        ({"tenant_id": "not-a-uuid"}, "tenant_id"),
        ({"tenant_id": uuid.uuid4()}, "tenant_id"),
        ({"priority": 40000}, "priority"),
        ({"priority": -40000}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"delay": -1}, "delay"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(engine, tenant, kwargs, field):
    args = {"kind": "reindex", "payload": {"ok": True}, "tenant_id": tenant, **kwargs}
    with engine.begin() as conn:
        with pytest.raises(ValidationError) as info:
            enqueue(conn, args.pop("kind"), args.pop("payload"), **args)
        assert info.value.field == field
        # The caller's transaction is still usable: nothing was aborted.
        assert conn.execute(text("SELECT 1")).scalar_one() == 1
    assert count_jobs(engine) == 0


def test_enqueue_many_inserts_in_order_and_dedupes(engine, tenant):
    with engine.begin() as conn:
        existing = enqueue(conn, "reindex", {}, tenant_id=tenant, idempotency_key="k-3")
    specs = [
        JobSpec("reindex", {"i": i}, tenant, idempotency_key=f"k-{i}") for i in range(5000)
    ]
    with engine.begin() as conn:
        ids = enqueue_many(conn, specs)
    assert len(ids) == 5000 and ids[3] == existing
    assert count_jobs(engine) == 5000
    with engine.connect() as conn:
        assert job_row(conn, ids[42])["payload"] == {"i": 42}


def keyless_batch(tenant: uuid.UUID, run_at: datetime) -> list[JobSpec]:
    # Characters that COPY's text format must escape travel in the payload.
    return [
        JobSpec("reindex", {"i": 0, "text": 'tab\tline\nslash\\ "q" \u00fc\u2028'}, tenant,
                priority=-5),
        JobSpec("bulk_import", {"i": 1}, tenant, delay=30, max_attempts=3),
        JobSpec("reindex", {"i": 2, "nested": {"a": [1, None, True]}}, str(tenant),
                run_at=run_at),
    ]


def assert_keyless_batch(engine, ids: list[uuid.UUID], run_at: datetime) -> None:
    with engine.connect() as conn:
        rows = [job_row(conn, job_id) for job_id in ids]
    assert [r["payload"]["i"] for r in rows] == [0, 1, 2]
    assert rows[0]["payload"]["text"] == 'tab\tline\nslash\\ "q" \u00fc\u2028'
    assert rows[2]["payload"]["nested"] == {"a": [1, None, True]}
    assert [r["kind"] for r in rows] == ["reindex", "bulk_import", "reindex"]
    assert [r["priority"] for r in rows] == [-5, 100, 100]
    assert [r["max_attempts"] for r in rows] == [8, 3, 8]
    assert {r["created_by"] for r in rows} == {"importer"}
    assert all(r["state"] == "pending" and r["attempts"] == 0 for r in rows)
    # Due times count from the transaction's now(), as the INSERT's do.
    assert rows[0]["available_at"] == rows[0]["created_at"]
    assert rows[1]["available_at"] - rows[1]["created_at"] == timedelta(seconds=30)
    assert abs((rows[2]["available_at"] - run_at).total_seconds()) < 0.001


@pytest.mark.parametrize("holder", ["connection", "session"])
def test_enqueue_many_without_keys_streams_in_the_callers_transaction(engine, tenant, holder):
    run_at = datetime.now(UTC) + timedelta(hours=1)
    with engine.connect() as conn:
        enqueue_many(conn, keyless_batch(tenant, run_at))
        conn.rollback()
    assert count_jobs(engine) == 0
    if holder == "session":
        with Session(engine) as session, session.begin():
            ids = enqueue_many(session, keyless_batch(tenant, run_at), created_by="importer")
    else:
        with engine.begin() as conn:
            ids = enqueue_many(conn, keyless_batch(tenant, run_at), created_by="importer")
    assert_keyless_batch(engine, ids, run_at)


@pytest.mark.parametrize("holder", ["connection", "session", "psycopg"])
async def test_enqueue_many_without_keys_streams_on_async_connections(
    async_engine, engine, tenant, libpq, holder
):
    import psycopg
    from sqlalchemy.ext.asyncio import AsyncSession

    run_at = datetime.now(UTC) + timedelta(hours=1)
    if holder == "session":
        async with AsyncSession(async_engine) as session, session.begin():
            ids = await enqueue_many_async(session, keyless_batch(tenant, run_at),
                                     created_by="importer")
    elif holder == "psycopg":
        async with await psycopg.AsyncConnection.connect(libpq) as conn:
            ids = await enqueue_many_async(conn, keyless_batch(tenant, run_at),
                                           created_by="importer")
            await conn.commit()
    else:
        async with async_engine.begin() as conn:
            ids = await enqueue_many_async(conn, keyless_batch(tenant, run_at),
                                           created_by="importer")
    assert_keyless_batch(engine, ids, run_at)


def test_enqueue_many_rejects_whole_batch(engine, tenant):
    specs = [JobSpec("reindex", {}, tenant), JobSpec("nope", {}, tenant)]
    with engine.begin() as conn, pytest.raises(ValidationError) as info:
        enqueue_many(conn, specs)
    assert info.value.field == "kind"
    specs = [JobSpec("reindex", {}, tenant), JobSpec("reindex", [], tenant)]  # type: ignore[arg-type]
    with engine.begin() as conn, pytest.raises(ValidationError) as info:
        enqueue_many(conn, specs)
    assert info.value.field == "jobs[1].payload"
    assert count_jobs(engine) == 0


@pytest.mark.parametrize(("jobs", "field"), [
    # A dict where a JobSpec goes was "'dict' object has no attribute 'kind'", and so was a
    # string (its letters); one JobSpec where a list goes, "'JobSpec' object is not
    # iterable": errors that name no field, unlike emit_many's.
    ([{"kind": "reindex", "payload": {}}], "jobs[0]"),
    (["reindex"], "jobs[0]"),
    ("reindex", "jobs"),
    (None, "jobs"),
    (42, "jobs"),
])
def test_enqueue_many_of_something_else_than_job_specs_names_it(engine, tenant, jobs, field):
    if jobs is None:
        jobs = JobSpec("reindex", {}, tenant)
    with engine.begin() as conn:
        with pytest.raises(ValidationError) as info:
            enqueue_many(conn, jobs)
        assert info.value.field == field and "JobSpec" in info.value.rule
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job")).scalar_one() == 0


def test_one_notify_per_transaction(engine, tenant, libpq):
    import psycopg

    from postrelay.relay import emit

    with psycopg.connect(libpq, autocommit=True) as listener:
        listener.execute("LISTEN postrelay_jobs")
        listener.execute("LISTEN postrelay_outbox")
        with engine.begin() as conn:
            for i in range(20):
                enqueue(conn, "reindex", {"i": i}, tenant_id=tenant)
        with engine.begin() as conn:
            enqueue(conn, "reindex", {}, tenant_id=tenant)
            for i in range(3):
                emit(conn, "order.placed", {"i": i}, tenant_id=tenant,
                     aggregate_type="order", aggregate_id=i)
        got = sorted(n.channel for n in listener.notifies(timeout=0.5))
    assert got == ["postrelay_jobs", "postrelay_jobs", "postrelay_outbox"]


def test_batches_wake_workers_and_relays_once_per_committed_transaction(engine, tenant,
                                                                        libpq):
    import psycopg

    from postrelay.relay import EventSpec, emit_many

    jobs = [JobSpec("reindex", {"i": i}, tenant) for i in range(3)]
    events = [EventSpec("order.placed", {"i": i}, tenant, "order", i) for i in range(3)]
    with psycopg.connect(libpq, autocommit=True) as listener:
        listener.execute("LISTEN postrelay_jobs")
        listener.execute("LISTEN postrelay_outbox")
        with engine.connect() as conn:  # rolled back: no wake-up
            enqueue_many(conn, jobs)
            emit_many(conn, events)
            conn.rollback()
        with engine.begin() as conn:
            enqueue_many(conn, jobs)
            enqueue_many(conn, jobs)
            emit_many(conn, events)
        with engine.execution_options(postrelay_notify=False).begin() as conn:
            enqueue_many(conn, jobs)
            emit_many(conn, events)
        got = sorted(n.channel for n in listener.notifies(timeout=0.5))
    assert got == ["postrelay_jobs", "postrelay_outbox"]
    assert count_jobs(engine) == 9


def test_notify_can_be_switched_off(engine, tenant, libpq):
    import psycopg

    quiet = engine.execution_options(postrelay_notify=False)
    with psycopg.connect(libpq, autocommit=True) as listener:
        listener.execute("LISTEN postrelay_jobs")
        with quiet.begin() as conn:
            enqueue(conn, "reindex", {}, tenant_id=tenant)
        assert list(listener.notifies(timeout=0.3)) == []


def test_enqueue_on_a_plain_psycopg_connection(engine, tenant, libpq):
    import psycopg

    with psycopg.connect(libpq) as conn:  # the caller's transaction: rolled back
        enqueue(conn, "reindex", {"n": 0}, tenant_id=tenant)
        conn.rollback()
        first = enqueue(conn, "reindex", {"n": 1}, tenant_id=tenant, idempotency_key="p1")
        again = enqueue(conn, "reindex", {"n": 2}, tenant_id=tenant, idempotency_key="p1")
        ids = enqueue_many(conn, [JobSpec("reindex", {"n": 3}, tenant)])
        with pytest.raises(ValidationError):
            enqueue(conn, "no_such_kind", {}, tenant_id=tenant)
        conn.commit()
    assert first == again
    with engine.connect() as conn:
        assert job_row(conn, first)["payload"] == {"n": 1}
        assert job_row(conn, ids[0])["payload"] == {"n": 3}
    assert count_jobs(engine) == 2


async def test_enqueue_and_emit_on_an_async_psycopg_connection(engine, tenant, libpq):
    import psycopg

    from postrelay.relay import emit_async

    async with await psycopg.AsyncConnection.connect(libpq) as conn:
        job_id = await enqueue_async(conn, "reindex", {"a": 1}, tenant_id=tenant)
        event_id = await emit_async(conn, "order.placed", {"total": 3}, tenant_id=tenant,
                              aggregate_type="order", aggregate_id=1)
        await conn.commit()
    with engine.connect() as conn:
        assert job_row(conn, job_id)["payload"] == {"a": 1}
        assert conn.execute(text("SELECT payload FROM mdm.aa_outbox_event WHERE id = :i"),
                            {"i": event_id}).scalar_one() == {"total": 3}
