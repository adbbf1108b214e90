"""The relay on a real PostgreSQL: exactly once, isolation of poison events, order per
aggregate, replay and retention. emit() and emit_many() are in test_emit.py."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from sqlalchemy import text

from postrelay.queue import FixedBackoff
from postrelay.relay import (
    Event,
    EventSpec,
    JobRequest,
    Relay,
    RelayConfig,
    RouteRegistry,
    emit,
    emit_many,
)
from tests.factories import scalar


@pytest.fixture
def outbox_clean(clean_db):
    """clean_db empties the outbox tables too."""


def order_routes() -> RouteRegistry:
    routes = RouteRegistry()

    @routes.route("order.placed")
    def reindex(event: Event) -> JobRequest:
        return JobRequest("reindex", {"order": event.aggregate_id})

    @routes.route("order.*", name="audit-import")
    def audit(event: Event) -> list[JobRequest]:
        return [JobRequest("bulk_import", {"order": event.aggregate_id, "part": n}, key=str(n))
                for n in range(2)]

    return routes


async def test_relay_fans_out_with_deterministic_keys_and_links(engine, async_engine, tenant,
                                                               outbox_clean):
    with engine.begin() as conn:
        placed = emit(conn, "order.placed", {}, tenant_id=tenant, aggregate_type="order",
                      aggregate_id="7")
        ignored = emit(conn, "user.created", {}, tenant_id=tenant, aggregate_type="user",
                       aggregate_id="u1")
    relay = Relay(async_engine, order_routes())
    result = await relay.run_once()
    assert (result.handled, result.jobs, result.failed) == (2, 3, 0)
    with engine.connect() as conn:
        jobs = conn.execute(text(
            "SELECT d.route, j.job_kind::text, j.idempotency_key FROM mdm.aa_outbox_delivery d "
            "JOIN mdm.aa_job j ON j.id = d.job_id WHERE d.event_id = :e ORDER BY d.route"),
            {"e": placed}).all()
        handled = conn.execute(text(
            "SELECT id, jobs_created FROM mdm.aa_outbox_event WHERE handled_at IS NOT NULL"
        )).all()
    assert [(r, k) for r, k, _ in jobs] == [("audit-import:0", "bulk_import"),
                                            ("audit-import:1", "bulk_import"),
                                            ("order_routes.<locals>.reindex", "reindex")]
    assert all(key.startswith(f"outbox:{placed}:") for _, _, key in jobs)
    assert dict(handled) == {placed: 3, ignored: 0}
    # A replay (the event handled again, e.g. by an operator) creates no second copy.
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_outbox_event SET handled_at = NULL"))
    await relay.run_once()
    assert scalar(engine, "SELECT count(*) FROM mdm.aa_job") == 3


async def test_a_replayed_event_beside_new_ones_gets_only_its_new_routes_jobs(
    engine, async_engine, tenant, outbox_clean
):
    # The relay links each (event, route) first and makes only the jobs whose link is new:
    # the replayed event keeps its jobs and gains the new route's.
    with engine.begin() as conn:
        old = emit(conn, "order.placed", {}, tenant_id=tenant, aggregate_type="order",
                   aggregate_id="1")
    routes = order_routes()
    await Relay(async_engine, routes).run_once()
    first = dict(_links(engine, old))
    routes.add("order.placed", lambda e: JobRequest("index_sync", {"order": e.aggregate_id}),
               name="report")
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_outbox_event SET handled_at = NULL"))
        new = emit(conn, "order.placed", {}, tenant_id=tenant, aggregate_type="order",
                   aggregate_id="2")
    result = await Relay(async_engine, routes).run_once()
    assert (result.handled, result.jobs, result.failed) == (2, 8, 0)
    again = dict(_links(engine, old))
    assert {r: again[r] for r in first} == first  # the existing jobs, linked again
    assert set(again) - set(first) == {"report"} and len(_links(engine, new)) == 4
    assert scalar(engine, "SELECT count(*) FROM mdm.aa_job") == 8
    assert scalar(engine, "SELECT count(*) FROM mdm.aa_outbox_event "
                          "WHERE handled_at IS NOT NULL AND jobs_created = 4") == 2


async def test_a_replayed_event_whose_job_retention_deleted_gets_it_again(
    engine, async_engine, tenant, outbox_clean
):
    with engine.begin() as conn:
        event = emit(conn, "order.placed", {}, tenant_id=tenant, aggregate_type="order",
                     aggregate_id="1")
    routes = order_routes()
    await Relay(async_engine, routes).run_once()
    first = dict(_links(engine, event))
    gone = next(iter(first))
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM mdm.aa_job WHERE id = :j"), {"j": first[gone]})
        conn.execute(text("UPDATE mdm.aa_outbox_event SET handled_at = NULL"))
    result = await Relay(async_engine, routes).run_once()
    assert (result.handled, result.failed) == (1, 0)
    again = dict(_links(engine, event))
    assert again[gone] != first[gone]  # the link took the new job
    assert {r: j for r, j in again.items() if r != gone} == \
        {r: j for r, j in first.items() if r != gone}
    with engine.connect() as conn:
        jobs = dict(conn.execute(text("SELECT id, idempotency_key FROM mdm.aa_job")).all())
    assert set(jobs) == set(again.values()) and len(jobs) == len(first)
    assert jobs[again[gone]] == f"outbox:{event}:{gone}"


def _links(engine, event_id) -> list[tuple[str, object]]:
    with engine.connect() as conn:
        return conn.execute(text("SELECT route, job_id FROM mdm.aa_outbox_delivery "
                                 "WHERE event_id = :e"), {"e": event_id}).all()


async def test_a_route_sees_the_event_as_emitted(engine, async_engine, tenant, outbox_clean):
    payload = {"order": {"id": 7, "lines": [1.5, None, True]}, "note": "tab\there, ünïcode"}
    with engine.begin() as conn:
        traced = emit(conn, "order.placed", payload, tenant_id=tenant, aggregate_type="order",
                      aggregate_id="7", headers={"trace_id": "t-7"})
        plain = emit(conn, "order.placed", {}, tenant_id=tenant, aggregate_type="order",
                     aggregate_id="8")
    seen: dict[object, Event] = {}
    routes = RouteRegistry()
    routes.add("order.placed", lambda event: seen.setdefault(event.id, event) and None,
               name="record")
    await Relay(async_engine, routes).run_once()
    assert seen[traced].payload == payload and seen[traced].headers == {"trace_id": "t-7"}
    assert seen[plain].payload == {} and seen[plain].headers == {}
    assert (seen[traced].tenant_id, seen[traced].aggregate_id) == (tenant, "7")


async def test_poison_event_is_isolated_retried_then_dead(engine, async_engine, tenant,
                                                         outbox_clean):
    routes = RouteRegistry()

    @routes.route("order.placed")
    def picky(event: Event) -> JobRequest:
        if event.payload.get("poison"):
            raise KeyError("customer")
        return JobRequest("reindex", {})

    @routes.route("order.bad_kind")
    def wrong(event: Event) -> JobRequest:
        return JobRequest("no_such_kind", {})

    with engine.begin() as conn:
        for n in range(3):
            emit(conn, "order.placed", {"poison": n == 1}, tenant_id=tenant,
                 aggregate_type="order", aggregate_id=n)
        emit(conn, "order.bad_kind", {}, tenant_id=tenant, aggregate_type="order",
             aggregate_id=9)
    relay = Relay(async_engine, routes, RelayConfig(max_attempts=2), backoff=FixedBackoff(0))
    first = await relay.run_once()
    assert (first.handled, first.jobs, first.failed, first.dead) == (2, 2, 2, 0)
    second = await relay.run_once()
    assert (second.handled, second.failed, second.dead) == (0, 2, 2)
    assert (await relay.run_once()).failed == 0  # dead events are parked, not retried
    with engine.connect() as conn:
        dead = conn.execute(text(
            "SELECT event_type, attempts, last_error FROM mdm.aa_outbox_event "
            "WHERE dead_at IS NOT NULL ORDER BY event_type")).all()
    assert [(t, a) for t, a, _ in dead] == [("order.bad_kind", 2), ("order.placed", 2)]
    assert "unknown job kind 'no_such_kind'" in dead[0][2]
    assert "KeyError" in dead[1][2]


async def test_a_route_asking_for_an_invalid_job_fails_only_its_event(
    engine, async_engine, tenant, outbox_clean
):
    routes = RouteRegistry()

    @routes.route("order.placed", name="sloppy")
    def sloppy(event: Event) -> JobRequest | list[JobRequest]:
        if event.payload["n"] == 4:  # two jobs under one name: their links would clash
            return [JobRequest("reindex", {}, key="x"), JobRequest("reindex", {}, key="x")]
        if event.payload["n"] == 1:
            return JobRequest("reindex", ["not", "an", "object"])  # type: ignore[arg-type]
        if event.payload["n"] == 2:
            return JobRequest("reindex", {}, priority=40_000)
        return JobRequest("reindex", {"n": event.payload["n"]})

    with engine.begin() as conn:
        ids = [emit(conn, "order.placed", {"n": n}, tenant_id=tenant, aggregate_type="order",
                    aggregate_id=n) for n in range(5)]
    result = await Relay(async_engine, routes).run_once()
    assert (result.handled, result.jobs, result.failed) == (2, 2, 3)
    with engine.connect() as conn:
        events = dict(conn.execute(text(
            "SELECT id, last_error FROM mdm.aa_outbox_event WHERE handled_at IS NULL")).all())
        payloads = conn.execute(text("SELECT payload FROM mdm.aa_job ORDER BY payload->>'n'"))
        assert [p for (p,) in payloads] == [{"n": 0}, {"n": 3}]
    assert set(events) == {ids[1], ids[2], ids[4]}
    assert "key: route 'sloppy' asked for two jobs named 'sloppy:x'" in events[ids[4]]
    assert "payload: must be a JSON object" in events[ids[1]]
    assert "priority: must be between" in events[ids[2]]
    assert "route 'sloppy' asked for an invalid job" in events[ids[2]]


async def test_concurrent_relays_and_writers_relay_each_committed_event_once(
    engine, async_engine, tenant, outbox_clean
):
    routes = RouteRegistry()
    routes.add("order.placed", lambda e: JobRequest("reindex", {"n": e.payload["n"]}),
               name="one")
    committed: list[int] = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        for batch in range(10):
            late = batch == 3
            with engine.connect() as conn:
                txn = conn.begin()
                numbers = [w * 10_000 + batch * 250 + i for i in range(250)]
                for n in numbers:
                    emit(conn, "order.placed", {"n": n}, tenant_id=tenant,
                         aggregate_type="order", aggregate_id=n)
                if late:
                    time.sleep(0.3)  # a long transaction that commits after later ones
                if batch == 5:
                    txn.rollback()  # never relayed
                    continue
                txn.commit()
                with lock:
                    committed.extend(numbers)

    relays = [Relay(async_engine, routes, RelayConfig(batch_size=200, poll_max_secs=0.05))
              for _ in range(3)]
    for relay in relays:
        await relay.start()
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        await asyncio.sleep(0.05)
    deadline = time.monotonic() + 60
    while scalar(engine, "SELECT count(*) FROM mdm.aa_outbox_event WHERE handled_at IS NULL"):
        assert time.monotonic() < deadline, "relays did not catch up"
        await asyncio.sleep(0.05)
    for relay in relays:
        await relay.stop()
    with engine.connect() as conn:
        relayed = [r[0] for r in conn.execute(text(
            "SELECT (payload->>'n')::int FROM mdm.aa_job WHERE job_kind = 'reindex'"))]
    assert len(committed) == 8 * 9 * 250  # 20,000 emitted, one batch per writer rolled back
    assert sorted(relayed) == sorted(committed)  # each committed event once, no rolled-back one


async def test_replay_creates_no_duplicate_and_retention_deletes_handled(
    engine, async_engine, tenant, outbox_clean
):

    from postrelay.core.clock import utcnow
    from postrelay.queue.maintenance import Cleaner, cleanup_handler
    from postrelay.queue.model import Job
    from postrelay.relay.admin import outbox_replay
    from postrelay.relay.retention import delete_handled_batch

    with engine.begin() as conn:
        old = emit(conn, "order.placed", {}, tenant_id=tenant, aggregate_type="order",
                   aggregate_id="1")
        new = emit(conn, "order.placed", {}, tenant_id=tenant, aggregate_type="order",
                   aggregate_id="2")
        pending = emit(conn, "order.later", {}, tenant_id=tenant, aggregate_type="order",
                       aggregate_id="3")
    relay = Relay(async_engine, order_routes())
    await relay.run_once()
    jobs_before = scalar(engine, "SELECT count(*) FROM mdm.aa_job")
    with engine.begin() as conn:
        assert outbox_replay(conn, event_id=old) == 1
    await relay.run_once()
    assert scalar(engine, "SELECT count(*) FROM mdm.aa_job") == jobs_before
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_outbox_event SET handled_at = now() - interval '8 days' "
                          "WHERE id = :i"), {"i": old})
        conn.execute(text("UPDATE mdm.aa_outbox_event SET handled_at = NULL, "
                          "dead_at = now() - interval '30 days' WHERE id = :i"), {"i": pending})
    handler = cleanup_handler(async_engine, 14, {"outbox": Cleaner(delete_handled_batch, 7)})
    now = utcnow()
    await handler(Job(old, tenant, "cleanup_jobs", {"target": "outbox"}, 100, 1, 3, now, now,
                      now, None))
    with engine.connect() as conn:
        left = set(conn.execute(text("SELECT id FROM mdm.aa_outbox_event")).scalars())
        links = conn.execute(text("SELECT count(*) FROM mdm.aa_outbox_delivery "
                                  "WHERE event_id = :i"), {"i": old}).scalar_one()
    assert left == {new, pending} and links == 0
    assert scalar(engine, "SELECT count(*) FROM mdm.aa_job") == jobs_before  # jobs stay


async def test_ordered_jobs_of_an_aggregate_run_in_event_order(engine, async_engine, libpq,
                                                               tenant, outbox_clean):
    from postrelay.queue import Registry
    from postrelay.queue.model import Job
    from postrelay.queue.worker import Worker, WorkerConfig

    routes = RouteRegistry()
    routes.add("account.*", lambda e: JobRequest("reindex", {"agg": e.aggregate_id,
                                                             "seq": e.payload["seq"]},
                                                 ordered=True), name="ledger")
    registry = Registry()
    log: list[tuple[str, str, int]] = []
    running: set[str] = set()
    overlap: list[str] = []

    @registry.handler("reindex")
    async def apply(job: Job) -> None:
        agg = job.payload["agg"]
        if agg in running:
            overlap.append(agg)
        running.add(agg)
        log.append(("start", agg, job.payload["seq"]))
        await asyncio.sleep(0.01)
        log.append(("end", agg, job.payload["seq"]))
        running.discard(agg)

    with engine.begin() as conn:
        for seq in range(8):
            for agg in ("a", "b", "c"):
                emit(conn, "account.changed", {"seq": seq}, tenant_id=tenant,
                     aggregate_type="account", aggregate_id=agg)
    relay = Relay(async_engine, routes, RelayConfig(poll_max_secs=0.05))
    workers = [Worker(async_engine, WorkerConfig(concurrency=4, poll_interval_secs=0.05),
                      registry=registry, listen_url=libpq) for _ in range(4)]
    for w in workers:
        await w.start()
    await relay.start()
    try:
        deadline = time.monotonic() + 60
        while sum(1 for e in log if e[0] == "end") < 24:
            assert time.monotonic() < deadline, "ordered jobs did not finish"
            await asyncio.sleep(0.05)
    finally:
        await relay.stop()
        for w in workers:
            await w.stop()
    assert not overlap
    for agg in ("a", "b", "c"):
        assert [s for kind, a, s in log if a == agg and kind == "start"] == list(range(8))
    # Different aggregates overlapped: some aggregate started while another was running.
    starts = [a for kind, a, _ in log if kind == "start"]
    assert len(set(starts[:3])) > 1


async def test_a_backlog_is_relayed_by_several_batches_in_flight(engine, async_engine, tenant,
                                                                  outbox_clean):
    loops: set[str] = set()

    def reindex(event: Event) -> JobRequest:
        loops.add(asyncio.current_task().get_name())
        return JobRequest("reindex", {"n": event.payload["n"]})

    routes = RouteRegistry()
    routes.add("order.placed", reindex, name="one")
    with engine.begin() as conn:
        emit_many(conn, [EventSpec("order.placed", {"n": n}, tenant, "order", n)
                         for n in range(3_000)])
    relay = Relay(async_engine, routes, RelayConfig(batch_size=50, concurrency=3, listen=False))
    await relay.start()
    deadline = time.monotonic() + 60
    while scalar(engine, "SELECT count(*) FROM mdm.aa_outbox_event WHERE handled_at IS NULL"):
        assert time.monotonic() < deadline, "the relay did not catch up"
        await asyncio.sleep(0.05)
    await relay.stop()
    assert len(loops) >= 2, loops  # the extra loops took part while the backlog lasted
    assert scalar(engine, "SELECT count(DISTINCT payload->>'n') FROM mdm.aa_job") == 3_000
    assert scalar(engine, "SELECT count(*) FROM mdm.aa_job") == 3_000
