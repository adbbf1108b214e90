"""What the flow-control acceptance tests share: the `public.flow_run` table the handlers
of apps/flow.py write, and reading it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

FLOW_APP = "tests.acceptance.apps.flow"


@pytest.fixture
def flow_runs(engine: Engine) -> Iterator[None]:
    with engine.begin() as conn:
        conn.execute(text(
            "CREATE TABLE IF NOT EXISTS public.flow_run (job_id uuid, attempt int, kind text, "
            "tenant_id uuid, pid int, started_at timestamptz, ended_at timestamptz)"))
        conn.execute(text("TRUNCATE public.flow_run"))
    yield


def runs(engine: Engine, kind: str | None = None) -> list[dict]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT * FROM public.flow_run WHERE CAST(:kind AS text) IS NULL OR kind = :kind "
            "ORDER BY started_at"), {"kind": kind}).mappings().all()
    return [dict(r) for r in rows]


def statuses(engine: Engine, kind: str) -> list[tuple[str, int]]:
    """(status, attempts) of every job of `kind`, sorted."""
    with engine.connect() as conn:
        return sorted(conn.execute(text(
            "SELECT status::text, attempts FROM mdm.aa_job WHERE job_kind::text = :kind"),
            {"kind": kind}).all())
