"""/metrics when one collector fails, for kinds without jobs, and with many tenants: each
collector's health is a series of its own, every kind of the enum is a series whether or not
it has jobs, and the tenants' rate series are bounded by a setting."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text

from postrelay.queue import STATUSES, ensure_tenant, job_kinds
from postrelay.queue.maintenance.retention import delete_done_before
from tests.api.conftest import SERVICE_KEY
from tests.api.server import serve_database
from tests.factories import insert_job
from tests.feedback.conftest import insert_log

COLLECTORS = {"queue", "outbox", "feedback", "inbound", "email_rates"}
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def _scrape(base: str) -> Samples:
    """{family: {labels: value}} of one scrape, which must answer 200."""
    response = httpx.get(f"{base}/metrics", headers={"apikey": SERVICE_KEY}, timeout=30)
    assert response.status_code == 200, response.text
    return {family.name: {tuple(sorted(s.labels.items())): s.value for s in family.samples}
            for family in text_string_to_metric_families(response.text)}


def _collectors_up(samples: Samples) -> dict[str, float]:
    return {labels[0][1]: value for labels, value in samples["postrelay_collector_up"].items()}


def _failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.fields["collector"] for r in caplog.records
            if getattr(r, "event", None) == "postrelay.api.metrics_failed"]


@contextmanager
def _renamed(engine: Engine, table: str) -> Iterator[None]:
    """`mdm.<table>` renamed away (committed, as a botched migration would leave it) for
    the block, and back after it whatever happens."""
    with engine.begin() as conn:
        conn.execute(text(f"ALTER TABLE mdm.{table} RENAME TO {table}_away"))
    try:
        yield
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE mdm.{table}_away RENAME TO {table}"))


def test_a_collector_that_fails_costs_only_its_own_families(database_url, engine, tenant,
                                                            caplog):
    """The feedback counts failed and took every feedback family with them, while
    postrelay_database_up stayed 1: an alert on those families saw no data, not a failure."""
    with engine.begin() as conn:
        insert_job(conn, tenant_id=tenant)
        insert_log(conn, tenant_id=tenant)
    with serve_database(database_url, SERVICE_KEY) as base:
        with _renamed(engine, "aa_email_feedback"):
            caplog.clear()
            broken = _scrape(base)
            assert _failures(caplog) == ["feedback"]  # once a scrape, by name
        healed = _scrape(base)
    assert broken["postrelay_database_up"][()] == 1
    assert _collectors_up(broken) == {**dict.fromkeys(COLLECTORS, 1), "feedback": 0}
    assert "postrelay_email_feedback_24h" not in broken
    assert "postrelay_email_feedback_unmatched_24h" not in broken
    # Everyone else's figures are all there.
    assert broken["postrelay_jobs"][(("kind", "reindex"), ("status", "pending"))] == 1
    assert broken["postrelay_outbox_backlog"][()] == 0
    assert broken["postrelay_feedback_inbox"][()] == 0
    answered = (("tenant", "acme"), ("tenant_id", str(tenant)), ("window", "24h"))
    assert broken["postrelay_email_answered"][answered] == 1
    assert _collectors_up(healed) == dict.fromkeys(COLLECTORS, 1)
    assert "postrelay_email_feedback_24h" in healed


def test_a_locked_table_fails_its_collector_not_the_scrape(database_url, engine, clean_db,
                                                           caplog):
    """A table held by an ACCESS EXCLUSIVE lock (a migration, VACUUM FULL) made the scrape
    wait for as long as the lock was held, past any scrape timeout."""
    with serve_database(database_url, SERVICE_KEY) as base, engine.connect() as holder:
        holder.execute(text("LOCK TABLE mdm.aa_feedback_inbox IN ACCESS EXCLUSIVE MODE"))
        started = time.monotonic()
        samples = _scrape(base)
        took = time.monotonic() - started
        holder.rollback()
    assert took < 8, took
    assert _collectors_up(samples) == {**dict.fromkeys(COLLECTORS, 1), "inbound": 0}
    assert "postrelay_feedback_inbox" not in samples and "postrelay_jobs" in samples
    assert _failures(caplog) == ["inbound"]


def test_a_kind_whose_jobs_retention_deleted_drops_to_zero(api_url, engine, async_engine,
                                                           tenant):
    """postrelay_jobs listed only the kinds that had jobs: once retention deleted a kind's
    last done jobs its series vanished instead of reading 0."""
    with engine.begin() as conn:
        insert_job(conn, tenant_id=tenant, kind="virus_scan", status="done",
                   completed_at=datetime.now(UTC) - timedelta(days=30))
        kinds = job_kinds(conn)
    before = _scrape(api_url)["postrelay_jobs"]
    assert before[(("kind", "virus_scan"), ("status", "done"))] == 1
    deleted = asyncio.run(delete_done_before(async_engine,
                                             datetime.now(UTC) - timedelta(days=14)))
    assert deleted == 1
    after = _scrape(api_url)["postrelay_jobs"]
    # Every kind of the enum, every status, jobs or none: the same series as before.
    assert set(after) == {(("kind", kind), ("status", status))
                          for kind in kinds for status in STATUSES}
    assert after[(("kind", "virus_scan"), ("status", "done"))] == 0
    assert after[(("kind", "gin_backfill"), ("status", "pending"))] == 0  # never had a job


def test_the_tenants_rates_are_bounded_by_a_setting(database_url, engine, clean_db):
    """Six series for every tenant that sent mail in 7 days, however many tenants: now the
    largest senders up to POSTRELAY_METRICS_MAX_TENANTS, and how many were left out."""
    sent = {"small": 1, "large": 3, "medium": 2, "tied": 2}
    with engine.begin() as conn:
        ids = {name: ensure_tenant(conn, name) for name in sent}
        for name, count in sent.items():
            for _ in range(count):
                insert_log(conn, tenant_id=ids[name])
    with serve_database(database_url, SERVICE_KEY, metrics_max_tenants=2) as base:
        samples = _scrape(base)
    # Ties go to the lower tenant id, so the set does not change from scrape to scrape.
    second = min(("medium", "tied"), key=lambda name: str(ids[name]))
    exported = {dict(labels)["tenant"] for labels in samples["postrelay_email_answered"]}
    assert exported == {"large", second}
    assert {dict(labels)["tenant"] for labels in samples["postrelay_email_bounce_rate"]} \
        == exported
    assert samples["postrelay_email_rate_tenants_omitted"][()] == 2
    with serve_database(database_url, SERVICE_KEY, metrics_max_tenants=0) as base:
        samples = _scrape(base)
    assert samples["postrelay_email_answered"] == {}
    assert samples["postrelay_email_rate_tenants_omitted"][()] == 4


def test_the_database_down_marks_every_collector_down(caplog):
    caplog.set_level(logging.WARNING)
    with serve_database("postgresql://nobody@127.0.0.1:9/none", SERVICE_KEY) as base:
        samples = _scrape(base)
    assert samples["postrelay_database_up"][()] == 0
    assert _collectors_up(samples) == dict.fromkeys(COLLECTORS, 0)
    assert _failures(caplog) == ["all"]  # one line, not one per collector
