"""emit() and emit_many() on a real PostgreSQL: in the caller's transaction only, bad input
refused whole, ten thousand events at once."""

from __future__ import annotations

import time
import uuid

import pytest
from sqlalchemy import text

from postrelay.core.errors import ValidationError
from postrelay.relay import EventSpec, emit, emit_async, emit_many, emit_many_async
from postrelay.relay.emit import COPY_MIN_EVENTS
from tests.factories import scalar


def test_emit_exists_only_if_caller_commits(engine, tenant, clean_db):
    with engine.connect() as conn, conn.begin() as txn:
        emit(conn, "order.placed", {"total": 1}, tenant_id=tenant,
             aggregate_type="order", aggregate_id=1)
        txn.rollback()
    assert scalar(engine, "SELECT count(*) FROM mdm.aa_outbox_event") == 0
    with engine.begin() as conn:
        event_id = emit(conn, "order.placed", {"total": 1}, tenant_id=tenant,
                        aggregate_type="order", aggregate_id=1, headers={"trace_id": "t-1"},
                        created_by="shop")
    assert scalar(engine, "SELECT headers->>'trace_id' FROM mdm.aa_outbox_event WHERE id = :i",
                  i=event_id) == "t-1"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"payload": [1]}, "payload"), ({"event_type": ""}, "event_type"),
     ({"tenant_id": None}, "tenant_id"),
     ({"tenant_id": "00000000-0000-0000-0000-00000000beef"}, "tenant_id"),
     ({"aggregate_type": ""}, "aggregate_type")],
)
def test_emit_bad_input_names_the_field(engine, tenant, clean_db, kwargs, field):
    args = {"event_type": "order.placed", "payload": {}, "tenant_id": tenant,
            "aggregate_type": "order", "aggregate_id": "1", **kwargs}
    with engine.begin() as conn:
        with pytest.raises(ValidationError) as info:
            emit(conn, args.pop("event_type"), args.pop("payload"), **args)
        assert info.value.field == field
        assert conn.execute(text("SELECT 1")).scalar_one() == 1  # transaction still usable
    assert scalar(engine, "SELECT count(*) FROM mdm.aa_outbox_event") == 0


async def test_emit_async_ten_thousand_in_one_transaction(async_engine, engine, tenant,
                                                          clean_db):
    started = time.perf_counter()
    async with async_engine.begin() as conn:
        for n in range(10_000):
            await emit_async(conn, "order.placed", {"n": n}, tenant_id=tenant,
                       aggregate_type="order", aggregate_id=n)
    elapsed = time.perf_counter() - started
    assert scalar(engine, "SELECT count(*) FROM mdm.aa_outbox_event") == 10_000
    print(f"10,000 emits in one transaction: {elapsed:.2f} s")


def ten_thousand(tenant) -> list:  # noqa: ANN001
    return [EventSpec("order.placed", {"n": n, "note": 'tab\there\\ "q" \u00e9'}, tenant,
                      "order", n, headers={"trace": f"t{n}"} if n % 2 else None)
            for n in range(10_000)]


def assert_ten_thousand(engine, ids) -> None:  # noqa: ANN001
    assert len(ids) == len(set(ids)) == 10_000
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT id, payload, headers, aggregate_id, created_by FROM mdm.aa_outbox_event "
            "ORDER BY seq")).all()
    # In input order: seq, and so the relay's order, follows the list.
    assert [r.id for r in rows] == ids
    assert [r.payload["n"] for r in rows] == list(range(10_000))
    assert rows[7].payload["note"] == 'tab\there\\ "q" \u00e9'
    assert rows[7].headers == {"trace": "t7"} and rows[8].headers == {}
    assert rows[9_999].aggregate_id == "9999" and {r.created_by for r in rows} == {"bulk"}


def test_emit_many_streams_ten_thousand_in_the_callers_transaction(engine, tenant,
                                                                   clean_db):
    with engine.connect() as conn:
        emit_many(conn, ten_thousand(tenant))
        conn.rollback()
    assert scalar(engine, "SELECT count(*) FROM mdm.aa_outbox_event") == 0
    started = time.perf_counter()
    with engine.begin() as conn:
        ids = emit_many(conn, ten_thousand(tenant), created_by="bulk")
    print(f"emit_many 10,000: {time.perf_counter() - started:.2f} s")
    assert_ten_thousand(engine, ids)


async def test_emit_many_streams_on_an_async_connection(engine, async_engine, tenant,
                                                        clean_db):
    async with async_engine.begin() as conn:
        ids = await emit_many_async(conn, ten_thousand(tenant), created_by="bulk")
    assert_ten_thousand(engine, ids)


def test_emit_many_rejects_the_whole_batch(engine, tenant, clean_db):
    specs = [EventSpec("order.placed", {}, tenant, "order", 1),
             EventSpec("order.placed", [], tenant, "order", 2)]  # type: ignore[arg-type]
    with engine.begin() as conn, pytest.raises(ValidationError) as info:
        emit_many(conn, specs)
    assert info.value.field == "events[1].payload"
    assert scalar(engine, "SELECT count(*) FROM mdm.aa_outbox_event") == 0


@pytest.mark.parametrize("size", [1, 3, COPY_MIN_EVENTS - 1, COPY_MIN_EVENTS])
def test_emit_many_of_any_size_writes_the_batch_in_order(engine, tenant, clean_db, size):
    # Below COPY_MIN_EVENTS one INSERT, from it on a COPY: the same rows either way.
    specs = [EventSpec("order.placed", {"n": i}, tenant, "order", i, {"h": i})
             for i in range(size)]
    with engine.begin() as conn:
        ids = emit_many(conn, specs, created_by="shop")
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT id, aggregate_id, payload, headers, created_by "
            "FROM mdm.aa_outbox_event ORDER BY seq")).all()
    assert [r.id for r in rows] == ids
    assert [(r.aggregate_id, r.payload, r.headers, r.created_by) for r in rows] == [
        (str(i), {"n": i}, {"h": i}, "shop") for i in range(size)]


@pytest.mark.parametrize("size", [2, COPY_MIN_EVENTS])
def test_emit_many_with_an_unknown_tenant_writes_nothing(engine, tenant, clean_db, size):
    unknown = uuid.uuid4()
    specs = [EventSpec("order.placed", {}, tenant, "order", i) for i in range(size - 1)]
    specs.append(EventSpec("order.placed", {}, unknown, "order", "last"))
    with engine.connect() as conn:
        with pytest.raises(ValidationError) as info:
            emit_many(conn, specs)
        assert info.value.field == "tenant_id" and str(unknown) in info.value.rule
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_outbox_event")).scalar() == 0
        conn.rollback()


@pytest.mark.parametrize(("events", "field"), [
    # A dict or a tuple where an EventSpec goes was "'dict' object has no attribute
    # 'event_type'"; one EventSpec where a list goes, "'EventSpec' object is not iterable".
    ([{"event_type": "order.placed", "payload": {}}], "events[0]"),
    (["order.placed"], "events[0]"),
    (None, "events"),
    ("order.placed", "events"),
])
def test_emit_many_of_something_else_than_event_specs_names_it(engine, tenant, clean_db,
                                                               events, field):
    if events is None:
        events = EventSpec("order.placed", {}, tenant, "order", 1)
    with engine.begin() as conn, pytest.raises(ValidationError) as info:
        emit_many(conn, events)
    assert info.value.field == field and "EventSpec" in info.value.rule
    assert scalar(engine, "SELECT count(*) FROM mdm.aa_outbox_event") == 0


@pytest.mark.parametrize("size", [0, 3, COPY_MIN_EVENTS])
@pytest.mark.parametrize(("created_by", "rule"), [
    (5, "must be a string"), ("importer\x00", "NUL"), ("\udc80", "surrogate")])
def test_emit_many_names_a_bad_created_by_as_its_own_argument(engine, tenant, clean_db, size,
                                                               created_by, rule):
    # It was named `events[0].created_by`, the first event's field, which no EventSpec has;
    # and with no events it was not checked at all, as enqueue_many checks it.
    events = [EventSpec("order.placed", {}, tenant, "order", n) for n in range(size)]
    with engine.begin() as conn:
        with pytest.raises(ValidationError) as info:
            emit_many(conn, events, created_by=created_by)
        assert info.value.field == "created_by" and rule in info.value.rule
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_outbox_event")).scalar() == 0


def test_a_payload_may_be_any_mapping_as_the_signatures_say(engine, tenant, clean_db):
    # A Mapping that is not a dict (a mappingproxy, a row's `_mapping`), at the top or
    # inside, was refused as "Object of type mappingproxy is not JSON serializable".
    from types import MappingProxyType

    from postrelay.queue import JobSpec, enqueue, enqueue_many

    with engine.begin() as conn:
        row = conn.execute(text("SELECT 42 AS total, 'eur' AS currency")).one()
        payload = MappingProxyType({"order": row._mapping, "lines": [MappingProxyType({})]})
        event_id = emit(conn, "order.placed", row._mapping, tenant_id=tenant,
                        aggregate_type="order", aggregate_id=1, headers=payload)
        (many_id,) = emit_many(conn, [EventSpec("order.placed", payload, tenant, "order", 2)])
        job_id = enqueue(conn, "reindex", payload, tenant_id=tenant)
        (batch_id,) = enqueue_many(conn, [JobSpec("reindex", row._mapping, tenant)])
        with pytest.raises(ValidationError) as info:
            emit(conn, "order.placed", MappingProxyType({"a": {"b": "\x00"}}),
                 tenant_id=tenant, aggregate_type="order", aggregate_id=3)
        assert info.value.field == "payload.a.b"
        with pytest.raises(ValidationError) as info:
            enqueue(conn, "reindex", MappingProxyType({"at": object()}), tenant_id=tenant)
        assert info.value.field == "payload" and "object is not JSON" in info.value.rule
    stored = {"order": {"total": 42, "currency": "eur"}, "lines": [{}]}
    with engine.connect() as conn:
        events = dict(conn.execute(text(
            "SELECT id, jsonb_build_array(payload, headers) FROM mdm.aa_outbox_event")).all())
        jobs = dict(conn.execute(text("SELECT id, payload FROM mdm.aa_job")).all())
    assert events == {event_id: [stored["order"], stored], many_id: [stored, {}]}
    assert jobs == {job_id: stored, batch_id: stored["order"]}
