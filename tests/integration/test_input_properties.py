"""Property: whatever a caller passes to `enqueue`, `enqueue_many`, `emit`, `enqueue_email`
or the HTTP jobs API — arbitrary JSON, strings with control characters, NULs and lone
surrogates, huge and deeply nested values — the answer is success or a ValidationError (a
4xx over HTTP), never another exception, and the caller's transaction is still usable: a
statement runs in it and it commits. What is accepted is stored as given.

Bounded examples and no deadline, so it stays quick in CI and does not flake under load.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from postrelay.core.errors import ValidationError
from postrelay.core.limits import DEFAULT_MAX_PAYLOAD_BYTES
from postrelay.orchestrator import EmailJob, enqueue_email
from postrelay.queue import JobSpec, enqueue, enqueue_many
from postrelay.relay import emit

PROPERTY = settings(max_examples=40, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.data_too_large])

# Any character, and often the ones that break things: NUL, lone surrogates, ESC, bidi
# overrides, DEL, a C1 control, a backslash.
NASTY = st.sampled_from(["\x00", "\ud800", "\udfff", "\x1b", "\u202e", "\x7f", "\x9b", "\\",
                         '"', "\n"])
CHARS = st.one_of(st.characters(), NASTY)
TEXT = st.text(CHARS, max_size=30)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63),
                    st.floats(allow_nan=True, allow_infinity=True), TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(TEXT, inner, max_size=5)), max_leaves=25)


def nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": [value]} if levels % 2 else {"a": value}
    return value


PAYLOADS = st.one_of(
    st.dictionaries(TEXT, JSON, max_size=6),
    st.integers(1, 3000).map(nested),
    st.integers(DEFAULT_MAX_PAYLOAD_BYTES - 64, DEFAULT_MAX_PAYLOAD_BYTES + 64).map(
        lambda n: {"blob": "x" * n}),
    JSON,  # mostly not an object: refused as such
)
KEYS = st.one_of(st.none(), TEXT, st.integers(500, 600).map(lambda n: "k" * n))
DELAYS = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True),
                   st.integers(-10, 10**12))
PRIORITIES = st.one_of(st.integers(-40_000, 40_000), st.just(100))
ATTEMPTS = st.one_of(st.none(), st.integers(-1, 2**32))


def comparable(value: Any) -> Any:
    """`value` as the JSON round trip gives it back, numbers as floats (jsonb may print an
    integral float as an integer)."""
    def numbers(item: Any) -> Any:
        if isinstance(item, bool) or item is None or isinstance(item, str):
            return item
        if isinstance(item, int | float):
            return float(item)
        if isinstance(item, list):
            return [numbers(i) for i in item]
        return {k: numbers(v) for k, v in item.items()}
    return numbers(json.loads(json.dumps(value)))


def still_usable(conn) -> None:
    assert conn.execute(text("SELECT 1")).scalar_one() == 1


@PROPERTY
@given(payload=PAYLOADS, key=KEYS, delay=DELAYS, priority=PRIORITIES, attempts=ATTEMPTS)
def test_enqueue_succeeds_or_refuses_and_the_transaction_survives(
        engine, tenant, payload, key, delay, priority, attempts):
    with engine.connect() as conn, conn.begin():
        try:
            job_id = enqueue(conn, "reindex", payload, tenant_id=tenant, idempotency_key=key,
                             delay=delay, priority=priority, max_attempts=attempts)
        except ValidationError as exc:
            event(f"refused: {exc.field.split('.')[0]}")
            job_id = None
        still_usable(conn)
        if job_id is not None and key is None:
            stored = conn.execute(text("SELECT payload::text FROM mdm.aa_job WHERE id = :id"),
                                  {"id": job_id}).scalar_one()
            assert comparable(json.loads(stored)) == comparable(payload)


@PROPERTY
@given(payloads=st.lists(PAYLOADS, min_size=1, max_size=4), key=KEYS, delay=DELAYS)
def test_enqueue_many_succeeds_or_refuses_and_the_transaction_survives(
        engine, tenant, payloads, key, delay):
    specs = [JobSpec("reindex", p, tenant, delay=delay, idempotency_key=key and f"{key}{i}")
             for i, p in enumerate(payloads)]
    with engine.connect() as conn, conn.begin():
        with contextlib.suppress(ValidationError):
            enqueue_many(conn, specs)
        still_usable(conn)


@PROPERTY
@given(payload=PAYLOADS, headers=st.one_of(st.none(), PAYLOADS), event_type=TEXT,
       aggregate_id=st.one_of(TEXT, st.integers()))
def test_emit_succeeds_or_refuses_and_the_transaction_survives(
        engine, tenant, payload, headers, event_type, aggregate_id):
    with engine.connect() as conn, conn.begin():
        try:
            event_id = emit(conn, event_type, payload, tenant_id=tenant, aggregate_type="order",
                            aggregate_id=aggregate_id, headers=headers)
        except ValidationError as exc:
            event(f"refused: {exc.field.split('.')[0]}")
            event_id = None
        still_usable(conn)
        if event_id is not None:
            stored = conn.execute(text(
                "SELECT payload::text FROM mdm.aa_outbox_event WHERE id = :id"),
                {"id": event_id}).scalar_one()
            assert comparable(json.loads(stored)) == comparable(payload)


@PROPERTY
@given(template=TEXT, context=st.one_of(st.dictionaries(TEXT, JSON, max_size=6),
                                        st.integers(1, 3000).map(nested)),
       to=st.one_of(st.just("ann@example.com"), TEXT), category=st.one_of(st.none(), TEXT),
       delay=DELAYS)
def test_enqueue_email_succeeds_or_refuses_and_the_transaction_survives(
        engine, tenant, template, context, to, category, delay):
    message = EmailJob(template=template, to=(to,), context=context, category=category)
    with engine.connect() as conn, conn.begin():
        with contextlib.suppress(ValidationError):
            enqueue_email(conn, message, tenant_id=tenant, delay=delay)
        still_usable(conn)
