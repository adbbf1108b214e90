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



def test_jobs_at_times_past_pythons_years_are_listed(api, engine, tenant):
    """PostgreSQL's timestamps run from 4713 BC to 294276 AD, Python's from year 1 to 9999,
    and the listings read only the infinities beyond them: a job written by hand as created
    in the year 12000, or finished in 44 BC, failed the job list and the DLQ ("timestamp
    too large") for every job beside it."""
    deep, plain = dead_jobs(engine, tenant)
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_job SET created_at = '12000-01-01', "
                          "completed_at = '0044-03-15 BC' WHERE id = :id"), {"id": deep})
    for path in ("/v1/functions/jobs", "/v1/functions/jobs/dlq"):
        times = {j["id"]: (j["created_at"], j["completed_at"]) for j in data(api.get(path))}
        assert set(times) == {str(deep), str(plain)}, path
        assert times[str(deep)][0].startswith("9999-12-31T23:59:59.999999"), path
        assert times[str(deep)][1].startswith("0001-01-01T00:00:00"), path
