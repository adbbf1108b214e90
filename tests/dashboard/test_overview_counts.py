"""The overview's job counts: exact for every job that is not done, whatever the history
beside them; done shown as the last hour (exact) and an estimate of all, said so on the page.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import Engine, text

from postrelay.dashboard import queries
from postrelay.dashboard.queries import DASHBOARD_SQL
from tests.factories import insert_job

KINDS = ("reindex", "email_send", "bulk_import")
LIVE = ("pending", "running", "failed", "dlq")


def add_history(engine: Engine, tenant_id: uuid.UUID, kind: str, n: int,
                completed_at: datetime) -> None:
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO mdm.aa_job (tenant_id, job_kind, status, payload, completed_at)"
            " SELECT :t, CAST(:kind AS mdm.job_kind), 'done', '{}', :at"
            " FROM generate_series(1, :n)"), {"t": tenant_id, "kind": kind, "n": n,
                                               "at": completed_at})


def analyze(engine: Engine) -> None:
    """As autovacuum leaves the table: VACUUM (a fresh visibility map), then ANALYZE, which
    records the partial indexes' sizes (VACUUM ANALYZE would keep VACUUM's, which it may
    skip counting when nothing was deleted)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM mdm.aa_job"))
        conn.execute(text("ANALYZE mdm.aa_job"))


def fill_mixed(engine: Engine, tenants: list[uuid.UUID]) -> None:
    """Every (tenant, kind) pair a different mix of statuses, done history between them in
    the index (done sorts between running and failed), and one pair with done jobs only."""
    now = datetime.now(UTC)
    with engine.begin() as conn:
        for t_index, tenant_id in enumerate(tenants):
            for k_index, kind in enumerate(KINDS):
                for s_index, status in enumerate(LIVE):
                    for _ in range((t_index + 2 * k_index + 3 * s_index) % 4):
                        insert_job(conn, tenant_id=tenant_id, kind=kind, status=status,
                                   completed_at=now if status in ("failed", "dlq") else None,
                                   claimed_at=now if status == "running" else None)
    for t_index, tenant_id in enumerate(tenants):
        for kind in KINDS:
            add_history(engine, tenant_id, kind, 200 + 100 * t_index, now - timedelta(days=2))
    add_history(engine, tenants[0], "virus_scan", 300, now - timedelta(days=3))


def exact(engine: Engine, tenant_id: uuid.UUID | None) -> dict[tuple[uuid.UUID, str, str], int]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT tenant_id, job_kind::text, status::text, count(*) FROM mdm.aa_job"
            " WHERE status <> 'done' AND (CAST(:t AS uuid) IS NULL OR tenant_id = :t)"
            " GROUP BY 1, 2, 3"), {"t": tenant_id}).all()
    return {(r[0], r[1], r[2]): r[3] for r in rows}


def test_live_counts_are_exact_per_tenant_kind_and_status(engine, tenant, other_tenant):
    fill_mixed(engine, [tenant, other_tenant])
    analyze(engine)
    for scope in (None, tenant, other_tenant):
        expected = exact(engine, scope)
        assert len(expected) >= 8  # several pairs, each with gaps
        with engine.connect() as conn:
            counts = queries.job_counts(conn, scope)
        by_tenant: dict[uuid.UUID, dict[str, int]] = {}
        by_kind: dict[str, dict[str, int]] = {}
        for (t, kind, status), n in expected.items():
            by_tenant.setdefault(t, {})[status] = by_tenant.get(t, {}).get(status, 0) + n
            by_kind.setdefault(kind, {})[status] = by_kind.get(kind, {}).get(status, 0) + n
        assert counts.by_tenant == by_tenant
        assert counts.by_kind == by_kind
        assert counts.by_status == {s: sum(n for (_, _, st), n in expected.items() if st == s)
                                    for s in LIVE}
        assert "done" not in counts.by_status and counts.total == sum(expected.values())
        if scope is not None:
            assert set(counts.by_tenant) == {scope}


def test_the_count_reads_the_same_pages_whatever_the_done_history(engine, tenant,
                                                                  other_tenant):
    fill_mixed(engine, [tenant, other_tenant])
    analyze(engine)  # statistics that know of little history
    small, small_pages = _history_and_buffers(engine, [tenant, other_tenant], 5_000)
    # Four times the history, in the same (tenant, kind) pairs, the statistics not told.
    large, large_pages = _history_and_buffers(engine, [tenant, other_tenant], 15_000)
    assert large_pages >= 2 * small_pages  # the whole index, which counting all jobs read
    for scope in (None, tenant):
        # The live counts descend the index once per (tenant, kind) pair and status: the
        # same pages however many done entries lie between them.
        assert large[scope] <= small[scope] + 2, (small, large)
        assert large[scope] < large_pages, (large, large_pages)


def _history_and_buffers(engine: Engine, tenants: list[uuid.UUID],
                         per_pair: int) -> tuple[dict[uuid.UUID | None, int], int]:
    """Add `per_pair` done jobs to each (tenant, kind) pair and VACUUM, as autovacuum would
    before its next ANALYZE; then: the buffers the count touched, and the pages of
    ix_job_tenant_kind."""
    for tenant_id in tenants:
        for kind in KINDS:
            add_history(engine, tenant_id, kind, per_pair,
                        datetime.now(UTC) - timedelta(days=1))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM mdm.aa_job"))  # a fresh visibility map; no ANALYZE
    with engine.connect() as conn:
        pages = conn.execute(text(
            "SELECT pg_relation_size('mdm.ix_job_tenant_kind') / 8192")).scalar_one()
    return _buffers(engine), pages


def _buffers(engine: Engine) -> dict[uuid.UUID | None, int]:
    """Shared buffers the statement touched, service role and one tenant."""
    found = {}
    with engine.connect() as conn:
        conn.execute(text("SET plan_cache_mode = force_custom_plan"))  # as the dashboard
        scopes = [None, *conn.execute(text(
            "SELECT id FROM mdm.aa_tenant WHERE name = 'acme'")).scalars()]
        for scope in scopes:
            plan = conn.execute(text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                                     + DASHBOARD_SQL["job_count_live"].text), {"tenant_id": scope})
            top = plan.scalar_one()
            top = top if isinstance(top, list) else json.loads(top)
            node = top[0]["Plan"]
            found[scope] = node["Shared Hit Blocks"] + node["Shared Read Blocks"]
    return found


def test_the_page_says_what_done_counts(admin: httpx.Client, acme: httpx.Client, engine,
                                        tenant, other_tenant):
    now = datetime.now(UTC)
    with engine.begin() as conn:
        for minutes_ago in (0, 5, 30):
            insert_job(conn, tenant_id=tenant, status="done",
                       completed_at=now - timedelta(minutes=minutes_ago))
        insert_job(conn, tenant_id=other_tenant, status="done", completed_at=now)
        insert_job(conn, tenant_id=tenant, status="pending")
    add_history(engine, tenant, "reindex", 500, now - timedelta(hours=3))  # before the hour
    analyze(engine)

    page = admin.get("/dashboard/").text
    assert 'data-count="status-done">4<' in page  # the last hour only, every tenant
    assert 'data-count="done-estimate">504<' in page  # from the statistics
    assert "an estimate from the table statistics" in page
    assert "each minute's count is tallied once it has closed" in page
    assert 'data-count="not-done">1<' in page
    # No done column per kind or tenant: those would be counts of the whole history.
    assert f'data-count="tenant-{tenant}-pending">1<' in page
    assert not re.search(r'data-count="(kind|tenant)-[^"]*-done"', page)

    mine = acme.get("/dashboard/panels").text
    assert 'data-count="status-done">3<' in mine
    # The statistics are not per tenant: a tenant session gets no estimate of all jobs.
    assert "done-estimate" not in mine


def test_the_estimate_waits_for_the_first_statistics(engine, tenant):
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE mdm.aa_job CASCADE"))
        assert queries.job_done_estimate(conn) is None
        overview = queries.overview(conn, tenant)
    assert overview.done_estimate is None and overview.done_last_hour == 0


def test_the_email_counts_are_the_last_day_of_the_scope_with_every_status(
        engine, tenant, other_tenant):
    now = datetime.now(UTC)
    rows = [(tenant, "sent", now), (tenant, "sent", now - timedelta(hours=3)),
            (tenant, "bounced", now), (tenant, "sent", now - timedelta(hours=30)),
            (other_tenant, "sent", now), (other_tenant, "deferred", now)]
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO mdm.aa_email_log (tenant_id, template, from_address, recipients,"
            " to_addresses, message_id, status, attempt, created_at) VALUES (:t, 'welcome',"
            " 'a@acme.example', '{b@example.com}', '{b@example.com}', '<m@x>', :s, 1, :at)"),
            [{"t": t, "s": s, "at": at} for t, s, at in rows])
        # A tenant's own rows (its index range), the service role's every tenant's.
        mine, everyone = queries.overview(conn, tenant), queries.overview(conn, None)
    zero = dict.fromkeys(queries.EMAIL_STATUSES, 0)
    assert mine.emails == {**zero, "sent": 2, "bounced": 1}
    assert everyone.emails == {**zero, "sent": 3, "bounced": 1, "deferred": 1}
