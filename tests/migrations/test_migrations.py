"""The Alembic history on a real PostgreSQL: it runs up from an empty database, down to
nothing and up again, twice without a change, and the migrations that move data move it
right.

Each test gets its own empty database (tests/migrations/conftest.py).
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Connection, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from postrelay.core.migrate import VERSION_TABLE, downgrade, head_revision, scripts, upgrade
from tests.migrations import SEED_KINDS, current_revision, enum_labels, schema_diff

SYSTEM_TENANT = uuid.UUID(int=0)


def _mdm_objects(conn: Connection) -> tuple[list[str], list[str]]:
    tables = conn.execute(
        text("SELECT tablename FROM pg_tables WHERE schemaname = 'mdm' ORDER BY 1")
    ).scalars()
    types = conn.execute(
        text(
            "SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
            "WHERE n.nspname = 'mdm' AND t.typtype = 'e' ORDER BY 1"
        )
    ).scalars()
    return list(tables), list(types)


def test_upgrade_empty_database_to_head(empty_url: str, empty_engine: Engine) -> None:
    with empty_engine.connect() as conn:
        assert current_revision(conn) is None
    upgrade(empty_url)
    with empty_engine.connect() as conn:
        assert current_revision(conn) == head_revision()
        tables, types = _mdm_objects(conn)
    assert {"aa_tenant", "aa_job", "aa_job_audit", VERSION_TABLE} <= set(tables)
    assert types == ["job_kind", "job_status"]


def test_downgrade_to_base_and_upgrade_again(empty_url: str, empty_engine: Engine) -> None:
    upgrade(empty_url)
    downgrade(empty_url, "base")
    with empty_engine.connect() as conn:
        assert current_revision(conn) is None
        tables, types = _mdm_objects(conn)
    assert tables in ([], [VERSION_TABLE])  # alembic keeps its (empty) version table
    assert types == []

    upgrade(empty_url)
    with empty_engine.connect() as conn:
        assert current_revision(conn) == head_revision()
        assert enum_labels(conn, "job_kind") == SEED_KINDS
        assert schema_diff(conn) == []


# Every definition in `mdm` that a migration makes (the version table aside).
_DEFINITIONS = text("""
    WITH mdm AS (SELECT oid FROM pg_namespace WHERE nspname = 'mdm')
    SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = 'mdm'
    UNION ALL SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' '
                     || pg_get_constraintdef(c.oid)
      FROM pg_constraint c WHERE connamespace = (SELECT oid FROM mdm)
    UNION ALL SELECT 'function ' || pg_get_functiondef(p.oid)
      FROM pg_proc p WHERE pronamespace = (SELECT oid FROM mdm)
    UNION ALL SELECT 'trigger ' || pg_get_triggerdef(t.oid)
      FROM pg_trigger t JOIN pg_class r ON r.oid = t.tgrelid
      WHERE r.relnamespace = (SELECT oid FROM mdm) AND NOT t.tgisinternal
    UNION ALL SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type || ' '
                     || is_nullable || ' ' || coalesce(column_default, '')
      FROM information_schema.columns WHERE table_schema = 'mdm'
    UNION ALL SELECT 'enum ' || t.typname || ' '
                     || string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
      FROM pg_type t JOIN pg_enum e ON e.enumtypid = t.oid
      WHERE t.typnamespace = (SELECT oid FROM mdm) GROUP BY t.typname
""")


def _definitions(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return {d for d in conn.execute(_DEFINITIONS).scalars() if VERSION_TABLE not in d}


def test_each_downgrade_restores_what_its_upgrade_found(
    empty_url: str, empty_engine: Engine
) -> None:
    """Up one migration at a time from nothing, then down one at a time: each step down
    leaves the schema as the step up found it. Migration 0007 took the email statuses from
    the code, so a database made at 0012 already took 0013's `cancelled`, which 0013's
    downgrade then took away."""
    revisions = [r.revision for r in reversed(list(scripts().walk_revisions()))]
    found: list[set[str]] = []
    for revision in revisions:
        found.append(_definitions(empty_engine))
        upgrade(empty_url, revision)
    for revision, before in zip(reversed(revisions), reversed(found), strict=True):
        downgrade(empty_url, "-1")
        after = _definitions(empty_engine)
        assert (sorted(after - before), sorted(before - after)) == ([], []), revision


def test_upgrade_twice_is_a_no_op(empty_url: str, empty_engine: Engine) -> None:
    def snapshot() -> tuple:
        with empty_engine.connect() as conn:
            oids = conn.execute(
                text(
                    "SELECT c.relname, c.oid FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = 'mdm' ORDER BY 1"
                )
            ).all()
            tenants = conn.execute(text("SELECT id, name FROM mdm.aa_tenant")).all()
            return current_revision(conn), oids, tenants

    upgrade(empty_url)
    before = snapshot()
    upgrade(empty_url)
    after = snapshot()
    # Same revision, same objects (not dropped and recreated), seed rows not inserted twice.
    assert after == before
    assert before[0] == head_revision()
    assert before[2] == [(SYSTEM_TENANT, "system")]


def test_0010_scopes_cron_names_per_tenant_and_removes_entries_that_break_the_rules(
        empty_url: str, empty_engine: Engine) -> None:
    upgrade(empty_url, "0009")
    insert = text("INSERT INTO mdm.aa_cron_entry (name, tenant_id, schedule, job_kind, payload, "
                  "created_by) VALUES (:n, :t, '0 0 * * * *', CAST(:k AS mdm.job_kind), '{}', "
                  ":by)")
    with empty_engine.begin() as conn:
        acme, globex = (conn.execute(text("INSERT INTO mdm.aa_tenant (name) VALUES (:n) "
                                          "RETURNING id"), {"n": n}).scalar_one()
                        for n in ("acme", "globex"))
        rows = [("nightly", acme, "reindex", "api:key:acme-app"),            # kept
                ("wipe", acme, "cleanup_jobs", "api:key:acme-app"),          # system kind
                ("spam", acme, "email_send", "dashboard:key:acme-dash"),     # trusted kind
                ("mail", globex, "email_send", "api:service-role"),          # kept: operator's
                ("postrelay.squat", globex, "reindex", "api:key:globex-app"),  # reserved name
                ("sweep", SYSTEM_TENANT, "cleanup_jobs", "cli:ops@host")]    # kept
        for name, tenant, kind, by in rows:
            conn.execute(insert, {"n": name, "t": tenant, "k": kind, "by": by})
    upgrade(empty_url, "0010")
    with empty_engine.begin() as conn:
        left = set(conn.execute(text("SELECT name FROM mdm.aa_cron_entry")).scalars())
        assert left == {"nightly", "mail", "sweep", "postrelay.retention",
                        "postrelay.outbox-retention", "postrelay.webhook-attempt-retention"}
        audited = conn.execute(text("SELECT name, actor, detail->>'job_kind' FROM "
                                    "mdm.aa_cron_audit WHERE action = 'cron_delete'")).all()
        assert sorted(audited) == [("postrelay.squat", "migration 0010", "reindex"),
                                   ("spam", "migration 0010", "email_send"),
                                   ("wipe", "migration 0010", "cleanup_jobs")]
        # One name per tenant now: globex may have a `nightly` too, acme not a second one.
        conn.execute(insert, {"n": "nightly", "t": globex, "k": "reindex", "by": "x"})
    with empty_engine.begin() as conn, pytest.raises(IntegrityError):
        conn.execute(insert, {"n": "nightly", "t": acme, "k": "reindex", "by": "x"})
    # Down again: the old one-name constraint holds after the younger `nightly` is renamed.
    downgrade(empty_url, "0009")
    with empty_engine.connect() as conn:
        names = conn.execute(text("SELECT name, tenant_id FROM mdm.aa_cron_entry "
                                  "WHERE name LIKE 'nightly%' ORDER BY created_at, id")).all()
    assert names == [("nightly", acme), (f"nightly:{globex}", globex)]
    upgrade(empty_url)
    with empty_engine.connect() as conn:
        assert schema_diff(conn) == []


def test_0017_moves_sending_rows_to_marks_and_back(empty_url: str, empty_engine: Engine) -> None:
    """A `sending` row of a live job becomes a sending mark the next attempt will find; one
    whose job is gone becomes `unknown` at once; every other row stays as it was."""
    upgrade(empty_url, "0013")
    log = text("INSERT INTO mdm.aa_email_log (tenant_id, job_id, template, from_address, "
               "recipients, to_addresses, message_id, status, attempt) VALUES (:t, :j, "
               "'welcome', 'noreply@acme.example', ARRAY[:a], ARRAY[:a], :m, :s, 1) "
               "RETURNING id")
    with empty_engine.begin() as conn:
        tenant = conn.execute(text("INSERT INTO mdm.aa_tenant (name) VALUES ('acme') "
                                   "RETURNING id")).scalar_one()
        jobs = [conn.execute(text("INSERT INTO mdm.aa_job (tenant_id, job_kind, payload) "
                                  "VALUES (:t, 'email_send', '{}') RETURNING id"),
                             {"t": tenant}).scalar_one() for _ in range(3)]
        in_flight, sent, orphan = (
            conn.execute(log, {"t": tenant, "j": job, "a": f"{n}@example.com",
                               "m": f"<{job}@acme.example>", "s": status}).scalar_one()
            for n, (job, status) in enumerate(
                zip(jobs, ("sending", "sent", "sending"), strict=True)))
        conn.execute(text("UPDATE mdm.aa_email_log SET job_id = NULL WHERE id = :id"),
                     {"id": orphan})
    upgrade(empty_url, "0017")
    with empty_engine.connect() as conn:
        statuses = dict(conn.execute(text("SELECT id, status FROM mdm.aa_email_log")).all())
        marks = conn.execute(text("SELECT id, job_id, row->>'message_id' "
                                  "FROM mdm.aa_email_sending")).all()
    assert statuses == {sent: "sent", orphan: "unknown"}
    assert marks == [(in_flight, jobs[0], f"<{jobs[0]}@acme.example>")]
    downgrade(empty_url, "0013")
    with empty_engine.connect() as conn:
        statuses = dict(conn.execute(text("SELECT id, status FROM mdm.aa_email_log")).all())
    assert statuses == {in_flight: "sending", sent: "sent", orphan: "unknown"}
    upgrade(empty_url)
    with empty_engine.connect() as conn:
        assert schema_diff(conn) == []


def test_0020_logs_the_marks_left_behind_unknown_and_drops_them(
        empty_url: str, empty_engine: Engine) -> None:
    """A sending mark left by a worker that died becomes the `unknown` log row the next
    attempt would have written, under the attempt's own id; the table goes, and comes back
    empty on downgrade."""
    upgrade(empty_url, "0019")
    with empty_engine.begin() as conn:
        tenant = conn.execute(text("INSERT INTO mdm.aa_tenant (name) VALUES ('acme') "
                                   "RETURNING id")).scalar_one()
        job = conn.execute(text("INSERT INTO mdm.aa_job (tenant_id, job_kind, payload) "
                                "VALUES (:t, 'email_send', '{}') RETURNING id"),
                           {"t": tenant}).scalar_one()
        mark = conn.execute(text(
            "INSERT INTO mdm.aa_email_sending (job_id, id, tenant_id, attempt, row) "
            "VALUES (:j, gen_random_uuid(), :t, 2, jsonb_build_object('template', 'welcome', "
            "'from_address', 'noreply@acme.example', 'recipients', ARRAY['a@example.com'], "
            "'to_addresses', ARRAY['a@example.com'], 'message_id', '<m@acme.example>')) "
            "RETURNING id"), {"j": job, "t": tenant}).scalar_one()
    upgrade(empty_url, "0020")
    with empty_engine.connect() as conn:
        rows = conn.execute(text("SELECT id, job_id, attempt, status, recipients "
                                 "FROM mdm.aa_email_log")).all()
        assert conn.execute(text("SELECT to_regclass('mdm.aa_email_sending')")).scalar() is None
    assert rows == [(mark, job, 2, "unknown", ["a@example.com"])]
    downgrade(empty_url, "0019")
    with empty_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_email_sending")).scalar() == 0
    upgrade(empty_url)
    with empty_engine.connect() as conn:
        assert schema_diff(conn) == []
