"""Rows that SQL written by hand can hold and postrelay's own calls never write, over real
HTTP: the listings that hold them still answer, with the rows beside them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import text

from tests.api.conftest import data
from tests.dashboard.conftest import insert_event
from tests.factories import insert_job

# PostgreSQL's jsonb parser takes about 15,000 levels under its default max_stack_depth
# (2 MB); Python's decoder gives out at about 1,000, pydantic's serializer at 255.
DEEP = "[" * 10_000 + "]" * 10_000
PLACEHOLDER = {"_unreadable": "nested more than 200 levels deep: too deep to show"}


def nest(engine, table: str, row: uuid.UUID, column: str = "payload",
         document: str = '{"n": ' + DEEP + "}") -> None:
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE mdm.{table} SET {column} = CAST(:doc AS jsonb) "
                          "WHERE id = :id"), {"doc": document, "id": row})


def dead_jobs(engine, tenant) -> tuple[uuid.UUID, uuid.UUID]:
    with engine.begin() as conn:
        deep, plain = (insert_job(conn, tenant_id=tenant, status="dlq", payload={"n": n},
                                  completed_at=datetime.now(UTC)) for n in (1, 2))
    nest(engine, "aa_job", deep)
    return deep, plain


def test_a_job_payload_nested_past_what_python_reads_is_a_placeholder(api, engine, tenant):
    """A payload nested 10,000 levels deep (jsonb takes it) failed the job list, the DLQ and
    the job's own answer with a 500, for every job listed beside it."""
    deep, plain = dead_jobs(engine, tenant)
    for path in ("/v1/functions/jobs", "/v1/functions/jobs/dlq"):
        payloads = {j["id"]: j["payload"] for j in data(api.get(path))}
        assert payloads == {str(deep): PLACEHOLDER, str(plain): {"n": 2}}, path
    assert data(api.get(f"/v1/functions/jobs/{deep}"))["payload"] == PLACEHOLDER


def test_a_payload_nested_past_what_the_answer_can_hold_is_a_placeholder(api, engine, tenant):
    """300 levels: Python reads it, but pydantic's serializer stops at 255, a 500."""
    deep, plain = dead_jobs(engine, tenant)
    nest(engine, "aa_job", deep, document='{"n": ' + "[" * 300 + "]" * 300 + "}")
    assert data(api.get(f"/v1/functions/jobs/{deep}"))["payload"] == PLACEHOLDER
    nest(engine, "aa_job", deep, document='{"n": ' + "[" * 150 + "]" * 150 + "}")
    shown = data(api.get(f"/v1/functions/jobs/{deep}"))["payload"]["n"]
    for _ in range(149):
        [shown] = shown
    assert shown == []


def test_an_outbox_event_nested_too_deep_is_a_placeholder(api, engine, tenant):
    with engine.begin() as conn:
        event = insert_event(conn, tenant)
    nest(engine, "aa_outbox_event", event)
    nest(engine, "aa_outbox_event", event, "headers")
    found = data(api.get(f"/v1/functions/outbox/events/{event}"))
    assert found["payload"] == PLACEHOLDER and found["headers"] == PLACEHOLDER

