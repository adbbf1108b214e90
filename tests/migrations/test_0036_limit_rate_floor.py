"""Migration 0036: a limit stored below the rate floor is raised to it, with an audit row,
so that the limited claim no longer fails for every tenant; the floor holds after it."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from postrelay.core.migrate import downgrade, upgrade
from tests.migrations import schema_diff


def test_0036_raises_a_rate_below_the_floor_and_keeps_the_others(
    empty_url: str, empty_engine: Engine
) -> None:
    tenant = uuid.uuid4()
    upgrade(empty_url, "0035")
    with empty_engine.begin() as conn:
        conn.execute(text("INSERT INTO mdm.aa_tenant (id, name) VALUES (:t, 'acme')"),
                     {"t": tenant})
        conn.execute(text(
            "INSERT INTO mdm.aa_job_limit (job_kind, tenant_id, rate_per_sec, burst, created_by)"
            " VALUES ('reindex', :t, 5e-324, 1, 'api:key:acme'),"
            "        ('reindex', NULL, 2.5, 5, 'cli:ops@host')"), {"t": tenant})
    upgrade(empty_url)
    with empty_engine.begin() as conn:
        assert schema_diff(conn) == []
        rates = dict(conn.execute(text(
            "SELECT created_by, rate_per_sec FROM mdm.aa_job_limit")).all())
        assert rates == {"api:key:acme": 1e-100, "cli:ops@host": 2.5}
        (audit,) = conn.execute(text(
            "SELECT action, tenant_id, actor, detail FROM mdm.aa_flow_audit")).all()
        assert audit[:3] == ("limit_set", tenant, "postrelay.migrate")
        assert audit[3]["rate_per_sec"] == 1e-100
        assert audit[3]["was"] == {"rate_per_sec": 5e-324}
    with empty_engine.begin() as conn, pytest.raises(IntegrityError,
                                                     match="job_limit_rate_chk"):
        conn.execute(text("UPDATE mdm.aa_job_limit SET rate_per_sec = 1e-200"))
    downgrade(empty_url, "0035")
    with empty_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job_limit")).scalar_one() == 2
