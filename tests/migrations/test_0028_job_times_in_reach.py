"""Migration 0028: a job whose due time no reader could load (a year before 1 in UTC, or past
9999) is given the nearest one it could have had; every other job keeps its own."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.engine import Engine

from postrelay.core.migrate import upgrade
from postrelay.queue import job_list
from tests.migrations import schema_diff


def test_0028_brings_unloadable_due_times_back_into_reach(
        empty_url: str, empty_engine: Engine) -> None:
    tenant = uuid.uuid4()
    upgrade(empty_url, "0027")
    with empty_engine.begin() as conn:
        conn.execute(text("INSERT INTO mdm.aa_tenant (id, name) VALUES (:t, 'acme')"),
                     {"t": tenant})
        conn.execute(text(
            "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, status, available_at) "
            "VALUES (:t, 'reindex', '{\"n\": \"bc\"}', 'pending', "
            "        TIMESTAMPTZ '0001-01-01 00:00:00+14'), "
            "       (:t, 'reindex', '{\"n\": \"far\"}', 'pending', "
            "        now() + make_interval(secs => 1e12)), "
            "       (:t, 'reindex', '{\"n\": \"due\"}', 'pending', "
            "        TIMESTAMPTZ '2026-01-01 00:00:00+00')"), {"t": tenant})
    upgrade(empty_url)  # through 0028; the schema is compared with the models at the head
    with empty_engine.connect() as conn:
        assert schema_diff(conn) == []
        due = {job.payload["n"]: job.available_at for job in job_list(conn, limit=10)}
    now = datetime.now(UTC)
    assert abs(due["bc"] - now) < timedelta(minutes=5)
    assert abs(due["far"] - (now + timedelta(days=3652))) < timedelta(days=2)
    assert due["due"] == datetime(2026, 1, 1, tzinfo=UTC)
