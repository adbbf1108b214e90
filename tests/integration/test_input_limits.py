"""Bad input to the library is a ValidationError naming the field and the rule, raised
before anything reaches PostgreSQL: the caller's transaction stays usable and commits what
else it wrote. (Until these checks, a NUL or an infinite delay aborted the transaction with
a DataError, and a deep payload raised RecursionError.)"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import text

from postrelay.core.errors import PayloadTooLargeError, ValidationError
from postrelay.core.limits import DEFAULT_MAX_PAYLOAD_BYTES, MAX_DEPTH
from postrelay.orchestrator import (
    EmailJob,
    email_list,
    enqueue_email,
    suppression_audit,
    suppression_list,
    suppression_remove,
)
from postrelay.queue import JobSpec, enqueue, enqueue_async, enqueue_many, ensure_tenant
from postrelay.relay import EventSpec, emit, emit_many


def nested(levels: int) -> dict[str, Any]:
    """An object `levels` deep: {"a": {"a": ... {}}}."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def refused_and_usable(engine, write: Callable[[Any], object], field: str, rule: str,
                       error: type[ValidationError] = ValidationError) -> None:
    """`write` raises `error` naming `field` with `rule` in its message; the same
    transaction then writes a row and commits it."""
    name = f"still-usable-{uuid.uuid4().hex}"
    with engine.connect() as conn, conn.begin():
        conn.execute(text("INSERT INTO mdm.aa_tenant (name) VALUES (:name)"), {"name": name})
        with pytest.raises(error) as caught:
            write(conn)
        assert caught.value.field == field, caught.value
        assert rule in caught.value.rule, caught.value
        assert conn.execute(text("SELECT 1")).scalar_one() == 1
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_tenant WHERE name = :name"),
                            {"name": name}).scalar_one() == 1
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_outbox_event")).scalar_one() == 0


@pytest.mark.parametrize(("payload", "field", "rule"), [
    ({"name": "a\x00b"}, "payload.name", "NUL"),
    ({"items": [1, {"k\x00": 2}]}, 'payload.items[1]["k\\u0000"]', "NUL"),
    ({"lone": "\ud800"}, "payload.lone", "surrogate"),
])
def test_a_nul_or_a_lone_surrogate_in_a_payload_is_refused_with_its_path(
        engine, tenant, payload, field, rule):
    refused_and_usable(engine, lambda c: enqueue(c, "reindex", payload, tenant_id=tenant),
                       field, rule)
    refused_and_usable(engine, lambda c: enqueue_many(
        c, [JobSpec("reindex", {}, tenant), JobSpec("reindex", payload, tenant)]),
        field.replace("payload", "jobs[1].payload", 1), rule)
    refused_and_usable(engine, lambda c: emit(
        c, "order.placed", payload, tenant_id=tenant, aggregate_type="order", aggregate_id=1),
        field, rule)
    refused_and_usable(engine, lambda c: emit_many(
        c, [EventSpec("order.placed", payload, tenant, "order", 1)]),
        "events[0]." + field, rule)


def test_a_backslash_u0000_written_out_is_not_a_nul(engine, tenant):
    # The text `\u0000` (a backslash and five characters) is fine; only U+0000 is not.
    with engine.begin() as conn:
        enqueue(conn, "reindex", {"s": "\\u0000", "e": "\\\ud83d\ude00"}, tenant_id=tenant)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT payload->>'s' FROM mdm.aa_job")).scalar_one() == \
            "\\u0000"


@pytest.mark.parametrize(("field", "kwargs"), [
    ("headers.trace", {"headers": {"trace": "\x00"}}),
    ("aggregate_id", {"aggregate_id": "42\x00"}),
    ("aggregate_type", {"aggregate_type": "order\x00"}),
    ("event_type", {"event_type": "order.placed\x00"}),
    ("created_by", {"created_by": "me\x00"}),
    ("aggregate_id", {"aggregate_id": "x" * 256}),
])
def test_emit_refuses_what_a_text_column_or_its_index_cannot_hold(engine, tenant, field, kwargs):
    args = {"event_type": "order.placed", "payload": {}, "tenant_id": tenant,
            "aggregate_type": "order", "aggregate_id": 1, **kwargs}
    event_type, payload = args.pop("event_type"), args.pop("payload")
    refused_and_usable(engine, lambda c: emit(c, event_type, payload, **args), field, "")


class Order:
    """What a caller may pass by mistake for its id: str() of it is its repr."""


@pytest.mark.parametrize("aggregate_id", [True, 1.5, Order()])
def test_an_aggregate_id_that_is_not_text_a_number_or_a_uuid_is_refused(engine, tenant,
                                                                        aggregate_id):
    args = {"tenant_id": tenant, "aggregate_type": "order", "aggregate_id": aggregate_id}
    rule = "must be a string, an integer or a UUID"
    refused_and_usable(engine, lambda c: emit(c, "order.placed", {}, **args), "aggregate_id",
                       rule)
    refused_and_usable(engine, lambda c: emit_many(c, [EventSpec("order.placed", {}, **args)]),
                       "events[0].aggregate_id", rule)


@pytest.mark.parametrize(("field", "kwargs", "rule"), [
    ("delay", {"delay": math.inf}, "from 0 to"),
    ("delay", {"delay": -math.inf}, "from 0 to"),
    ("delay", {"delay": math.nan}, "from 0 to"),
    ("delay", {"delay": 1e300}, "from 0 to"),
    ("delay", {"delay": -1}, "from 0 to"),
    ("priority", {"priority": 40_000}, "smallint"),
    # Year 1 at +14:00 is a year before it in UTC: stored, it could not be loaded again.
    ("run_at", {"run_at": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))},
     "years 1 to 9999 in UTC"),
    ("run_at", {"run_at": datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-14)))},
     "at most 315360000 seconds"),
    ("run_at", {"run_at": datetime.now(UTC) + timedelta(days=3651)}, "(10 years) from now"),
    ("run_at", {"run_at": datetime(2030, 1, 1)}, "timezone-aware"),
    ("max_attempts", {"max_attempts": 2**31}, "between 1 and 2147483647"),
    ("max_attempts", {"max_attempts": 0}, "between 1 and 2147483647"),
    ("idempotency_key", {"idempotency_key": "k\x00"}, "NUL"),
    ("idempotency_key", {"idempotency_key": "k" * 513}, "at most 512"),
    ("idempotency_key", {"idempotency_key": "outbox:1:x"}, "outbox relay's prefix"),
    ("kind", {"kind": "reindex\x00"}, "NUL"),
    ("created_by", {"created_by": "\x00"}, "NUL"),
])
def test_enqueue_refuses_out_of_range_numbers_and_unstorable_keys(engine, tenant, field, kwargs,
                                                                  rule):
    args = {"kind": "reindex", "payload": {}, "tenant_id": tenant, **kwargs}
    kind, payload = args.pop("kind"), args.pop("payload")
    refused_and_usable(engine, lambda c: enqueue(c, kind, payload, **args), field, rule)
    if field != "created_by":
        refused_and_usable(engine, lambda c: enqueue_many(c, [JobSpec(kind, payload, **args)]),
                           f"jobs[0].{field}", rule)


@pytest.mark.parametrize(("name", "rule"), [
    ("", "a tenant name must be a non-empty string"),
    ("a\x00b", "must not contain the NUL character"),
    ("x\ud800y", "unpaired surrogate"),
    ("y" * 256, "must be at most 255 characters, got 256"),
    ("acme\nglobex", "must not contain control characters"),
    ("acme\tcorp", "must not contain control characters"),
    ("acme\x1b[31m", "must not contain control characters"),
])
def test_ensure_tenant_refuses_a_name_a_text_column_cannot_hold(engine, name, rule):
    """A NUL ended in the driver's DataError, a lone surrogate in a UnicodeEncodeError; a
    name of any length was taken. A line break or a terminal escape made a tenant that the
    lists showed as two lines, or escaped, and `--tenant` could hardly name."""
    refused_and_usable(engine, lambda c: ensure_tenant(c, name), "name", rule)


def test_a_deep_payload_is_refused_past_the_documented_depth(engine, tenant):
    with engine.begin() as conn:  # exactly the limit is fine
        enqueue(conn, "reindex", nested(MAX_DEPTH), tenant_id=tenant)
        emit(conn, "order.placed", {"list": [nested(MAX_DEPTH - 2)]}, tenant_id=tenant,
             aggregate_type="order", aggregate_id=1)
        conn.execute(text("DELETE FROM mdm.aa_job"))
        conn.execute(text("DELETE FROM mdm.aa_outbox_event"))
    for levels in (MAX_DEPTH + 1, 5000):  # 5,000 levels used to raise RecursionError
        refused_and_usable(engine, lambda c, n=levels: enqueue(
            c, "reindex", nested(n), tenant_id=tenant), "payload", "64 levels")
        refused_and_usable(engine, lambda c, n=levels: emit_many(
            c, [EventSpec("order.placed", {}, tenant, "order", 1, headers=nested(n))]),
            "events[0].headers", "64 levels")


def test_a_payload_over_the_size_limit_is_refused(engine, tenant, monkeypatch):
    big = {"blob": "x" * DEFAULT_MAX_PAYLOAD_BYTES}
    refused_and_usable(engine, lambda c: enqueue(c, "reindex", big, tenant_id=tenant),
                       "payload", "over the limit of 262144", PayloadTooLargeError)
    refused_and_usable(engine, lambda c: emit(c, "order.placed", big, tenant_id=tenant,
                                              aggregate_type="order", aggregate_id=1),
                       "payload", "POSTRELAY_MAX_PAYLOAD_BYTES", PayloadTooLargeError)
    monkeypatch.setenv("POSTRELAY_MAX_PAYLOAD_BYTES", "2048")
    small = {"blob": "y" * 2100}
    refused_and_usable(engine, lambda c: enqueue_many(c, [JobSpec("reindex", small, tenant)]),
                       "jobs[0].payload", "over the limit of 2048", PayloadTooLargeError)
    # Non-ASCII counts as its \u escape: 400 x 6 bytes is over 2,048.
    refused_and_usable(engine, lambda c: enqueue(c, "reindex", {"s": "é" * 400},
                                                 tenant_id=tenant),
                       "payload", "over the limit of 2048", PayloadTooLargeError)
    with engine.begin() as conn:
        enqueue(conn, "reindex", {"blob": "y" * 1900}, tenant_id=tenant)


@pytest.mark.parametrize(("message", "field", "rule"), [
    (EmailJob("welcome", ("a@example.com",), context={"name": "x\x00"}), "context.name", "NUL"),
    (EmailJob("wel\x00come", ("a@example.com",)), "template", "not a template name"),
    (EmailJob("welcome", ("a@example.com",), context=nested(80)), "message", "64 levels"),
    (EmailJob("welcome", ("a@example.com",), context={"b": "x" * 300_000}), "message",
     "over the limit"),
])
def test_enqueue_email_names_the_messages_field(engine, tenant, message, field, rule):
    refused_and_usable(engine, lambda c: enqueue_email(c, message, tenant_id=tenant), field, rule)


def test_enqueue_email_refuses_an_event_id_that_is_not_a_uuid(engine, tenant):
    """It was written into the payload as given, and every run of the job then failed."""
    message = EmailJob("welcome", ("a@example.com",), event_id="not-a-uuid")  # type: ignore[arg-type]
    refused_and_usable(engine, lambda c: enqueue_email(c, message, tenant_id=tenant),
                       "event_id", "must be a UUID")


def test_enqueue_email_refuses_an_infinite_delay(engine, tenant):
    message = EmailJob("welcome", ("a@example.com",))
    refused_and_usable(engine, lambda c: enqueue_email(c, message, tenant_id=tenant,
                                                       delay=math.inf), "delay", "from 0 to")


async def test_async_enqueue_refuses_the_same_and_keeps_the_transaction(async_engine, tenant):
    async with async_engine.connect() as conn, conn.begin():
        with pytest.raises(ValidationError, match="NUL"):
            await enqueue_async(conn, "reindex", {"a": "\x00"}, tenant_id=tenant)
        with pytest.raises(ValidationError, match="delay"):
            await enqueue_async(conn, "reindex", {}, tenant_id=tenant, delay=math.inf)
        await enqueue_async(conn, "reindex", {"a": "fine"}, tenant_id=tenant)
    async with async_engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM mdm.aa_job"))).scalar_one() == 1


@pytest.mark.parametrize(("read", "field", "rule"), [
    (lambda c: email_list(c, recipient="a\x00@example.com"), "recipient", "NUL"),
    (lambda c: email_list(c, template="welcome\udcff"), "template", "surrogate"),
    (lambda c: suppression_list(c, address="a\udcff@example.com"), "address", "surrogate"),
    (lambda c: suppression_audit(c, address="a\x00@example.com"), "address", "NUL"),
    (lambda c: suppression_remove(c, "a\x00@example.com", tenant_id=uuid.uuid4(),
                                  actor="cli"), "address", "NUL"),
    (lambda c: suppression_remove(c, "a@example.com", tenant_id=uuid.uuid4(), actor="cli",
                                  category="news\udcff"), "category", "surrogate"),
    (lambda c: suppression_remove(c, "  ", tenant_id=uuid.uuid4(), actor="cli"), "address",
     "name the address"),
])
def test_the_email_logs_filters_refuse_what_no_text_column_holds(engine, tenant, read, field,
                                                                  rule):
    """A NUL (from the HTTP API) ended in the driver's DataError, and an unpaired surrogate
    (a byte of a command line that was not UTF-8) in an UnicodeEncodeError, where the
    operator read neither the field nor the rule. An empty address to lift named none."""
    refused_and_usable(engine, read, field, rule)
