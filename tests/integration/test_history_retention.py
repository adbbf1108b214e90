"""Retention of what grows besides done jobs: the email log, its delivery feedback, webhook
attempts and the audits (jobs, cron, pauses and limits, lifted suppressions), deleted in
bounded batches by `cleanup_jobs` targets whose windows come from the settings (kept when
unset); and the time-ordered ids the growing tables get by default."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID, uuid4

import pytest
from sqlalchemy import text

from postrelay.core import clock
from postrelay.core.clock import utcnow
from postrelay.core.db import Database, sqlalchemy_url
from postrelay.core.errors import ConfigError
from postrelay.core.settings import Settings, load_settings
from postrelay.orchestrator.retention import (
    EMAIL_FEEDBACK_TARGET,
    EMAIL_LOG_TARGET,
    email_feedback_delete_batch,
    email_log_delete_batch,
    email_suppression_audit_delete_batch,
    feedback_retention_days,
)
from postrelay.queue import Registry, ensure_tenant
from postrelay.queue.maintenance import AUDIT_TARGET, Cleaner, audit_cleaner, cleanup_handler
from postrelay.queue.maintenance.retention import DELETE_BATCH
from postrelay.queue.model import Job
from postrelay.queue.schema import SYSTEM_TENANT_ID
from postrelay.relay.webhooks import webhook_attempt_delete_batch
from postrelay.relay.webhooks.endpoints import WEBHOOK_SQL
from postrelay.runtime import build_worker

LOG_ROWS = """
INSERT INTO mdm.aa_email_log (tenant_id, template, from_address, recipients, to_addresses,
                              message_id, status, attempt, created_at)
SELECT :tenant, 'welcome', 'noreply@example.com', ARRAY['a@example.com'],
       ARRAY['a@example.com'], '<' || g || '@x>', 'sent', 1, :at
FROM generate_series(1, :n) g
"""


def _cleanup_job(target: str) -> Job:
    now = utcnow()
    return Job(UUID(int=1), SYSTEM_TENANT_ID, "cleanup_jobs", {"target": target}, 100, 1, 3,
               now, now, now, None)


def _log_counts(engine) -> dict[tuple[str, bool], int]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT t.name, l.created_at < now() - interval '30 days', count(*)"
            " FROM mdm.aa_email_log l JOIN mdm.aa_tenant t ON t.id = l.tenant_id"
            " GROUP BY 1, 2")).all()
    return {(name, old): n for name, old, n in rows}


async def test_email_log_rows_older_than_the_window_go_in_batches_for_every_tenant(
        engine, async_engine, tenant):
    now = utcnow()
    with engine.begin() as conn:
        other = ensure_tenant(conn, "globex")
        # More old rows than one batch for one tenant, a few for the other.
        conn.execute(text(LOG_ROWS), {"tenant": tenant, "at": now - timedelta(days=40),
                                      "n": DELETE_BATCH * 2 + 10})
        conn.execute(text(LOG_ROWS), {"tenant": other, "at": now - timedelta(days=31), "n": 7})
        conn.execute(text(LOG_ROWS), {"tenant": tenant, "at": now - timedelta(days=29), "n": 5})
        conn.execute(text(LOG_ROWS), {"tenant": other, "at": now, "n": 3})
    handler = cleanup_handler(async_engine, 14, {
        EMAIL_LOG_TARGET: Cleaner(email_log_delete_batch, 30)})
    await handler(_cleanup_job(EMAIL_LOG_TARGET))
    assert _log_counts(engine) == {("acme", False): 5, ("globex", False): 3}


@pytest.mark.parametrize(("status", "kept"), [
    ("pending", True), ("running", True), ("dlq", True), ("done", False), ("failed", False)])
async def test_an_unknown_row_stays_while_its_job_may_run_again(engine, async_engine, tenant,
                                                                status, kept):
    """The next attempt reads it (on_unknown = "hold"), and so does feedback that completes
    a held job (tests/feedback/test_held_job.py); other rows of the job go."""
    from tests.factories import insert_job

    with engine.begin() as conn:
        job = insert_job(conn, tenant_id=tenant, kind="email_send", status=status)
        conn.execute(text(LOG_ROWS), {"tenant": tenant, "at": utcnow() - timedelta(days=40),
                                      "n": 2})
        conn.execute(text("UPDATE mdm.aa_email_log SET job_id = :j"), {"j": job})
        conn.execute(text("UPDATE mdm.aa_email_log SET status = 'unknown' "
                          "WHERE message_id = '<1@x>'"))
    deleted = await email_log_delete_batch(async_engine, utcnow() - timedelta(days=30), 1000)
    assert deleted == (1 if kept else 2)


async def test_the_log_rows_of_a_tenant_deleted_since_age_out_too(engine, async_engine,
                                                                   tenant):
    """The log keeps a deleted tenant's rows; retention went tenant by tenant through the
    tenants that exist, and kept those for good."""
    gone = uuid4()
    with engine.begin() as conn:
        conn.execute(text(LOG_ROWS), {"tenant": gone, "at": utcnow() - timedelta(days=400),
                                      "n": 3})
        conn.execute(text(LOG_ROWS), {"tenant": gone, "at": utcnow(), "n": 2})
    handler = cleanup_handler(async_engine, 14, {
        EMAIL_LOG_TARGET: Cleaner(email_log_delete_batch, 30)})
    await handler(_cleanup_job(EMAIL_LOG_TARGET))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_email_log WHERE tenant_id = :t"),
                            {"t": gone}).scalar() == 2


async def test_without_a_window_the_email_log_is_kept(engine, async_engine, tenant):
    with engine.begin() as conn:
        conn.execute(text(LOG_ROWS), {"tenant": tenant, "at": utcnow() - timedelta(days=3650),
                                      "n": 4})
    handler = cleanup_handler(async_engine, 14, {
        EMAIL_LOG_TARGET: Cleaner(email_log_delete_batch, None)})
    await handler(_cleanup_job(EMAIL_LOG_TARGET))  # no error: nothing to do
    assert _log_counts(engine) == {("acme", True): 4}


AUDITS = ("aa_job_audit", "aa_cron_audit", "aa_flow_audit", "aa_email_suppression_audit")


async def _audit_cleanup(settings: Settings) -> None:
    """The `audit` target run as a worker builds it from the settings: the queue's audits
    and the suppression audit, under POSTRELAY_AUDIT_RETENTION_DAYS."""
    process = build_worker(settings, Database(url=sqlalchemy_url(settings.database_url)),
                           registry=Registry(), maintenance=False)
    cleanup = process.worker.registry.get("cleanup_jobs")
    assert cleanup is not None
    try:
        await cleanup.fn(_cleanup_job(AUDIT_TARGET))
    finally:
        await process.worker.engine.dispose()


async def test_audit_rows_older_than_the_window_go_from_every_audit(database_url, engine,
                                                                    tenant):
    now = utcnow()
    with engine.begin() as conn:
        for days, n in ((100, DELETE_BATCH + 5), (1, 2)):
            at = {"t": tenant, "at": now - timedelta(days=days), "n": n}
            conn.execute(text(
                "INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, actor,"
                " created_at) SELECT gen_random_uuid(), :t, 'reindex', 'job_dlq', 'test', :at"
                " FROM generate_series(1, :n)"), at)
            conn.execute(text(
                "INSERT INTO mdm.aa_cron_audit (cron_id, name, tenant_id, action, actor,"
                " created_at) SELECT gen_random_uuid(), 'nightly', :t, 'created', 'test', :at"
                " FROM generate_series(1, 3)"), at)
            conn.execute(text(
                "INSERT INTO mdm.aa_flow_audit (action, tenant_id, job_kind, actor, created_at)"
                " SELECT 'paused', :t, 'reindex', 'test', :at FROM generate_series(1, 4)"), at)
            conn.execute(text(
                "INSERT INTO mdm.aa_email_suppression_audit (tenant_id, address, action, actor,"
                " detail, created_at) SELECT :t, 'a' || g || '@example.com', 'unsuppress',"
                " 'test', '[]', :at FROM generate_series(1, :n) g"), at)
    await _audit_cleanup(Settings(database_url=database_url, audit_retention_days=90))
    with engine.connect() as conn:
        left = [conn.execute(text(
            f"SELECT count(*), bool_and(created_at > now() - interval '2 days') FROM mdm.{t}"
        )).one() for t in AUDITS]
    assert left == [(2, True), (3, True), (4, True), (2, True)]


async def test_a_lifts_audit_row_outlives_a_shorter_audit_window_for_the_soft_bounce_window(
        database_url, engine, tenant):
    """A lift's row is where the address's soft-bounce count starts afresh: deleted sooner,
    the bounces from before the lift counted again and suppressed the address lifted."""
    now = utcnow()
    with engine.begin() as conn:
        for days in (3, 10):
            at = {"t": tenant, "at": now - timedelta(days=days)}
            conn.execute(text(
                "INSERT INTO mdm.aa_flow_audit (action, tenant_id, job_kind, actor, created_at)"
                " VALUES ('paused', :t, 'reindex', 'test', :at)"), at)
            conn.execute(text(
                "INSERT INTO mdm.aa_email_suppression_audit (tenant_id, address, action, actor,"
                " detail, created_at) VALUES (:t, 'ann@example.com', 'unsuppress', 'test',"
                " '{\"lifted\": [{\"category\": \"\"}]}', :at)"), at)
    await _audit_cleanup(Settings(database_url=database_url, audit_retention_days=1,
                                  email_soft_bounce_window_days=7))
    with engine.connect() as conn:
        left = [conn.execute(text(
            f"SELECT count(*), bool_and(created_at > now() - interval '4 days') FROM mdm.{t}"
        )).one() for t in ("aa_flow_audit", "aa_email_suppression_audit")]
    assert left == [(0, None), (1, True)]


async def test_the_lifts_floor_is_measured_on_the_database_clock(database_url, engine, tenant,
                                                                 monkeypatch):
    """The soft-bounce floor came from this host's clock, where the audits' window comes
    from the database's: on a host whose clock ran a month fast, a lift made three days ago
    fell out with a one-day audit window, and the bounces from before it suppressed the
    address again. A month slow, the suppression audit was kept a month too long."""
    real = clock.datetime
    with engine.begin() as conn:
        db_now = conn.execute(text("SELECT now()")).scalar_one()
        for days in (3, 10):
            conn.execute(text(
                "INSERT INTO mdm.aa_email_suppression_audit (tenant_id, address, action, actor,"
                " detail, created_at) VALUES (:t, :a, 'unsuppress', 'test', '[]', :at)"),
                {"t": tenant, "a": f"{days}@example.com", "at": db_now - timedelta(days=days)})
    for skew in (timedelta(days=30), -timedelta(days=30)):
        class Skewed(real):  # this host's clock, off by `skew`
            @classmethod
            def now(cls, tz=None, skew=skew):
                return real.now(tz) + skew

        monkeypatch.setattr(clock, "datetime", Skewed)
        await _audit_cleanup(Settings(database_url=database_url, audit_retention_days=1,
                                      email_soft_bounce_window_days=7))
        with engine.connect() as conn:
            left = conn.execute(text(
                "SELECT address FROM mdm.aa_email_suppression_audit")).scalars().all()
        assert left == ["3@example.com"], skew


async def test_without_a_window_every_audit_is_kept(engine, async_engine, tenant):
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO mdm.aa_flow_audit (action, tenant_id, job_kind, actor, created_at)"
            " VALUES ('paused', :t, 'reindex', 'test', now() - interval '10 years')"),
                     {"t": tenant})
    handler = cleanup_handler(async_engine, 14, {AUDIT_TARGET: audit_cleaner(
        None, [email_suppression_audit_delete_batch])})
    await handler(_cleanup_job(AUDIT_TARGET))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_flow_audit")).scalar_one() == 1


def test_the_windows_are_settings_and_the_log_and_audits_are_kept_by_default(monkeypatch):
    settings = load_settings()
    assert settings.email_log_retention_days is None
    assert settings.audit_retention_days is None
    assert settings.webhook_attempt_retention_days == 30
    monkeypatch.setenv("POSTRELAY_EMAIL_LOG_RETENTION_DAYS", "400")
    monkeypatch.setenv("POSTRELAY_AUDIT_RETENTION_DAYS", "730")
    settings = load_settings()
    assert (settings.email_log_retention_days, settings.audit_retention_days) == (400, 730)
    monkeypatch.setenv("POSTRELAY_EMAIL_LOG_RETENTION_DAYS", "0")
    with pytest.raises(ConfigError, match="POSTRELAY_EMAIL_LOG_RETENTION_DAYS"):
        load_settings()


def test_the_log_feedback_and_audit_targets_have_built_in_hourly_cron_entries(engine,
                                                                                clean_db):
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT name, schedule, job_kind::text, payload FROM mdm.aa_cron_entry"
            " WHERE name IN ('postrelay.email-log-retention', 'postrelay.audit-retention',"
            " 'postrelay.email-feedback-retention') ORDER BY name")).all()
    assert [tuple(r) for r in rows] == [
        ("postrelay.audit-retention", "0 50 * * * *", "cleanup_jobs", {"target": "audit"}),
        ("postrelay.email-feedback-retention", "0 20 * * * *", "cleanup_jobs",
         {"target": "email_feedback"}),
        ("postrelay.email-log-retention", "0 15 * * * *", "cleanup_jobs",
         {"target": "email_log"}),
    ]


def test_rows_inserted_without_an_id_get_a_time_ordered_one(engine, tenant):
    with engine.begin() as conn:
        ids = [conn.execute(text(
            "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload)"
            " VALUES (:t, 'reindex', '{}') RETURNING id"), {"t": tenant}).scalar_one()
            for _ in range(2)]
        conn.execute(text("SELECT pg_sleep(0.002)"))
        later = conn.execute(text("SELECT mdm.uuid_v7()")).scalar_one()
        stamp = conn.execute(text(
            "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint")).scalar_one()
    for value in [*ids, later]:
        assert value.version == 7
    assert max(ids) < later
    assert abs((later.int >> 80) - stamp) < 1000


def test_the_updated_tables_are_vacuumed_at_one_percent_dead(engine):
    with engine.connect() as conn:
        options = dict(conn.execute(text(
            "SELECT relname, reloptions FROM pg_class WHERE relnamespace = 'mdm'::regnamespace"
            " AND relname IN ('aa_job', 'aa_outbox_event')")).all())
    expected = ["autovacuum_vacuum_scale_factor=0.01", "autovacuum_vacuum_threshold=10000",
                "autovacuum_analyze_scale_factor=0.02"]
    assert options == {"aa_job": expected, "aa_outbox_event": expected}


FEEDBACK_ROWS = """
INSERT INTO mdm.aa_email_feedback (tenant_id, email_log_id, matched_by, recipient, kind,
                                   source, dedupe_key, received_at)
SELECT CAST(:tenant AS uuid),
       CASE WHEN CAST(:tenant AS uuid) IS NULL THEN NULL ELSE gen_random_uuid() END,
       CASE WHEN CAST(:tenant AS uuid) IS NULL THEN NULL ELSE 'verp' END,
       'a@example.com', 'bounced', 'mail', :key || g, :at
FROM generate_series(1, :n) g
"""


async def test_feedback_older_than_its_window_goes_in_batches_unmatched_included(
        engine, async_engine, tenant):
    now = utcnow()
    with engine.begin() as conn:
        for key, who, days, n in (("old", tenant, 40, DELETE_BATCH + 20),
                                  ("stray", None, 35, 4),  # unmatched: no tenant, no log row
                                  ("new", tenant, 10, 6), ("fresh", None, 0, 2)):
            conn.execute(text(FEEDBACK_ROWS), {
                "tenant": who, "key": key, "at": now - timedelta(days=days), "n": n})
        conn.execute(text(
            "INSERT INTO mdm.aa_email_suppression (tenant_id, address, reason, feedback_id)"
            " SELECT :t, 'a@example.com', 'bounced', id FROM mdm.aa_email_feedback"
            " WHERE dedupe_key = 'old1'"), {"t": tenant})
    handler = cleanup_handler(async_engine, 14, {
        EMAIL_FEEDBACK_TARGET: Cleaner(email_feedback_delete_batch, 30)})
    await handler(_cleanup_job(EMAIL_FEEDBACK_TARGET))
    with engine.connect() as conn:
        left = conn.execute(text(
            "SELECT regexp_replace(dedupe_key, '[0-9]+$', ''), count(*)"
            " FROM mdm.aa_email_feedback GROUP BY 1")).all()
        suppressed = conn.execute(text(
            "SELECT count(*) FROM mdm.aa_email_suppression")).scalar_one()
    assert dict(left) == {"new": 6, "fresh": 2}
    assert suppressed == 1  # the suppression outlives the report behind it


def test_feedback_follows_the_log_window_and_never_undercuts_the_soft_bounce_window(
        monkeypatch):
    assert feedback_retention_days(load_settings()) is None  # kept, as the log is
    monkeypatch.setenv("POSTRELAY_EMAIL_LOG_RETENTION_DAYS", "400")
    assert feedback_retention_days(load_settings()) == 400
    monkeypatch.setenv("POSTRELAY_EMAIL_LOG_RETENTION_DAYS", "2")  # shorter than 7 days
    assert feedback_retention_days(load_settings()) == 7
    monkeypatch.setenv("POSTRELAY_EMAIL_FEEDBACK_RETENTION_DAYS", "90")
    assert feedback_retention_days(load_settings()) == 90
    monkeypatch.setenv("POSTRELAY_EMAIL_FEEDBACK_RETENTION_DAYS", "3")
    with pytest.raises(ConfigError, match=r"POSTRELAY_EMAIL_FEEDBACK_RETENTION_DAYS: .*"
                                          r"POSTRELAY_EMAIL_SOFT_BOUNCE_WINDOW_DAYS \(7\)"):
        load_settings()
    monkeypatch.setenv("POSTRELAY_EMAIL_SOFT_BOUNCE_WINDOW_DAYS", "2")
    assert feedback_retention_days(load_settings()) == 3


async def test_webhook_attempts_older_than_the_window_go_endpoint_by_endpoint(
        engine, async_engine, tenant):
    now = utcnow()
    with engine.begin() as conn:
        endpoints = [conn.execute(text(
            "INSERT INTO mdm.aa_webhook_endpoint (tenant_id, url, secret)"
            " VALUES (:t, :url, 'whsec_x') RETURNING id"),
            {"t": tenant, "url": f"https://hooks.example.com/{n}"}).scalar_one()
            for n in range(3)]
        for endpoint, days, n in ((endpoints[0], 45, DELETE_BATCH + 3), (endpoints[1], 31, 5),
                                  (endpoints[1], 29, 4), (endpoints[2], 0, 2)):
            conn.execute(text(
                "INSERT INTO mdm.aa_webhook_attempt (endpoint_id, event_id, attempt,"
                " duration_ms, created_at) SELECT :e, gen_random_uuid(), 1, 5, :at"
                " FROM generate_series(1, :n)"),
                {"e": endpoint, "at": now - timedelta(days=days), "n": n})
    handler = cleanup_handler(async_engine, 14, {
        "webhook_attempts": Cleaner(webhook_attempt_delete_batch, 30)})
    await handler(_cleanup_job("webhook_attempts"))
    with engine.connect() as conn:
        left = conn.execute(text(
            "SELECT endpoint_id, count(*) FROM mdm.aa_webhook_attempt GROUP BY 1")).all()
    assert dict(left) == {endpoints[1]: 4, endpoints[2]: 2}
    # The run's last, short batch finds nothing old without reading the recent attempts
    # (walking all of ix_webhook_attempt_endpoint_time for old ones did).
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO mdm.aa_webhook_attempt (endpoint_id, event_id, attempt, duration_ms,"
            " created_at) SELECT :e, gen_random_uuid(), 1, 5, now() - g * interval '1 ms'"
            " FROM generate_series(1, 60000) g"),
            {"e": endpoints[2]})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE mdm.aa_webhook_attempt"))
    with engine.begin() as conn:
        index_pages = conn.execute(text(
            "SELECT pg_relation_size('mdm.ix_webhook_attempt_endpoint_time') / 8192"
        )).scalar_one()
        plan = conn.execute(text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                                 + WEBHOOK_SQL["webhook_attempt_delete_before"].text),
                            {"before": now - timedelta(days=30), "batch": DELETE_BATCH}
                            ).scalar_one()
        conn.rollback()
    touched = plan[0]["Plan"]["Shared Hit Blocks"] + plan[0]["Plan"]["Shared Read Blocks"]
    assert index_pages > 300 and touched < 100, (touched, index_pages)
