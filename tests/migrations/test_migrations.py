"""The Alembic migrations on a real PostgreSQL: the schema matches the AA_JOB seed, the models
match the migrations, and the history runs down and up again.

Each test gets its own empty database (see `tests.migrations.throwaway_database`).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import uuid
from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from postrelay.core.db import SCHEMA, metadata, sqlalchemy_url
from postrelay.core.migrate import VERSION_TABLE, downgrade, head_revision, upgrade
from tests.migrations import (
    SEED_KINDS,
    SEED_STATUSES,
    current_revision,
    enum_labels,
    throwaway_database,
)

# Every module that declares tables; the optional ones are imported when they exist, so a
# table added to the models without a migration (or the reverse) fails the comparison.
SCHEMA_MODULES = (
    "postrelay.queue.schema",
    "postrelay.relay.schema",
    "postrelay.relay.webhooks.schema",
    "postrelay.access.schema",
    "postrelay.orchestrator.schema",
)
SYSTEM_TENANT = uuid.UUID(int=0)


@pytest.fixture
def empty_url(server_url: str) -> Iterator[str]:
    with throwaway_database(server_url) as url:
        yield url


@pytest.fixture
def empty_engine(empty_url: str) -> Iterator[Engine]:
    eng = create_engine(sqlalchemy_url(empty_url))
    yield eng
    eng.dispose()


@pytest.fixture
def migrated(empty_url: str, empty_engine: Engine) -> Engine:
    upgrade(empty_url)
    return empty_engine


# --- the schema at head, read from the catalogs ---------------------------------------------


def columns(conn: Connection, table: str) -> list[tuple[str, str, bool, str | None]]:
    """(name, type, not null, default) per column, in table order."""
    return [
        tuple(row)  # type: ignore[misc]
        for row in conn.execute(
            text(
                """
                SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                       pg_get_expr(d.adbin, d.adrelid)
                FROM pg_attribute a
                LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                WHERE a.attrelid = CAST(:t AS regclass) AND a.attnum > 0 AND NOT a.attisdropped
                ORDER BY a.attnum
                """
            ),
            {"t": table},
        )
    ]


def indexes(conn: Connection, table: str) -> dict[str, tuple[bool, list[str], str | None]]:
    """index name -> (unique, columns in order, predicate of a partial index)."""
    rows = conn.execute(
        text(
            """
            SELECT c.relname, i.indisunique,
                   ARRAY(SELECT a.attname
                         FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                         ORDER BY k.ord),
                   pg_get_expr(i.indpred, i.indrelid)
            FROM pg_index i
            JOIN pg_class c ON c.oid = i.indexrelid
            WHERE i.indrelid = CAST(:t AS regclass)
            """
        ),
        {"t": table},
    )
    return {name: (unique, list(cols), pred) for name, unique, cols, pred in rows}


def constraints(conn: Connection, table: str) -> dict[str, tuple[str, str]]:
    rows = conn.execute(
        text(
            "SELECT conname, contype, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = CAST(:t AS regclass)"
        ),
        {"t": table},
    )
    return {name: (kind, definition) for name, kind, definition in rows}


def test_enums_are_the_seeds_values_in_order(migrated: Engine) -> None:
    with migrated.connect() as conn:
        assert enum_labels(conn, "job_kind") == SEED_KINDS
        assert enum_labels(conn, "job_status") == SEED_STATUSES


def test_model_enums_are_the_seeds_values_in_order() -> None:
    # compare_metadata does not look at enum labels, so check the model side here.
    from postrelay.queue.schema import BUILTIN_KINDS, STATUSES, job_kind, job_status

    assert list(BUILTIN_KINDS) == list(job_kind.enums) == SEED_KINDS
    assert list(STATUSES) == list(job_status.enums) == SEED_STATUSES


def test_aa_job_columns_match_the_seed(migrated: Engine) -> None:
    tz = "timestamp with time zone"
    with migrated.connect() as conn:
        got = columns(conn, "mdm.aa_job")
    assert got == [
        ("id", "uuid", True, "mdm.uuid_v7()"),
        ("tenant_id", "uuid", True, None),
        ("job_kind", "mdm.job_kind", True, None),
        ("status", "mdm.job_status", True, "'pending'::mdm.job_status"),
        ("payload", "jsonb", True, None),
        ("priority", "smallint", True, "100"),
        ("available_at", tz, True, "now()"),
        ("attempts", "integer", True, "0"),
        ("max_attempts", "integer", True, "8"),
        ("last_error", "text", False, None),
        ("claimed_by", "text", False, None),
        ("claimed_at", tz, False, None),
        ("completed_at", tz, False, None),
        ("idempotency_key", "text", False, None),
        ("created_at", tz, True, "now()"),
        ("created_by", "text", False, None),
    ]


def test_aa_job_keys_and_named_checks(migrated: Engine) -> None:
    with migrated.connect() as conn:
        cons = constraints(conn, "mdm.aa_job")
    by_kind = {(kind, definition) for kind, definition in cons.values()}
    assert ("p", "PRIMARY KEY (id)") in by_kind
    assert ("f", "FOREIGN KEY (tenant_id) REFERENCES mdm.aa_tenant(id)") in by_kind
    assert cons["job_payload_is_object_chk"][0] == "c"
    assert "jsonb_typeof(payload) = 'object'" in cons["job_payload_is_object_chk"][1]
    assert cons["job_attempts_nonneg_chk"][0] == "c"
    assert "attempts >= 0" in cons["job_attempts_nonneg_chk"][1]
    assert "max_attempts >= 1" in cons["job_attempts_nonneg_chk"][1]


def _insert(conn: Connection, **overrides: object) -> None:
    values: dict[str, object] = {
        "tenant_id": SYSTEM_TENANT,
        "kind": "reindex",
        "payload": "{}",
        "attempts": 0,
        "max_attempts": 8,
        "key": None,
    }
    values.update(overrides)
    conn.execute(
        text(
            "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, attempts, max_attempts, "
            "idempotency_key) VALUES (:tenant_id, CAST(:kind AS mdm.job_kind), "
            "CAST(:payload AS jsonb), :attempts, :max_attempts, :key)"
        ),
        values,
    )


@pytest.mark.parametrize(
    ("overrides", "constraint"),
    [
        ({"payload": json.dumps([1, 2])}, "job_payload_is_object_chk"),
        ({"payload": json.dumps("text")}, "job_payload_is_object_chk"),
        ({"payload": "null"}, "job_payload_is_object_chk"),
        ({"max_attempts": 0}, "job_attempts_nonneg_chk"),
        ({"attempts": -1}, "job_attempts_nonneg_chk"),
    ],
)
def test_checks_refuse_bad_rows(migrated: Engine, overrides: dict, constraint: str) -> None:
    with migrated.connect() as conn, pytest.raises(IntegrityError) as info:
        _insert(conn, **overrides)
    assert constraint in str(info.value)


def test_defaults_fill_a_minimal_row(migrated: Engine) -> None:
    with migrated.begin() as conn:
        row = conn.execute(
            text(
                "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload) "
                "VALUES (:t, 'email_send', '{}') "
                "RETURNING status::text, priority, attempts, max_attempts, "
                "available_at <= now() AS available, id IS NOT NULL AS has_id"
            ),
            {"t": SYSTEM_TENANT},
        ).one()
        conn.rollback()
    assert tuple(row) == ("pending", 100, 0, 8, True, True)


def test_idempotency_key_is_unique_per_tenant_and_kind_only_when_set(migrated: Engine) -> None:
    with migrated.connect() as conn:
        _insert(conn, key=None)
        _insert(conn, key=None)  # NULL keys never collide: the index is partial
        _insert(conn, key="k1")
        _insert(conn, key="k1", kind="bulk_import")  # another kind may reuse the key
        with pytest.raises(IntegrityError) as info:
            _insert(conn, key="k1")
        assert "job_idempotency_uk" in str(info.value)
        conn.rollback()


def test_aa_job_indexes_match_the_seed(migrated: Engine) -> None:
    with migrated.connect() as conn:
        got = indexes(conn, "mdm.aa_job")
    assert got["job_idempotency_uk"] == (  # the relay's keys are kept unique by its links
        True,
        ["tenant_id", "job_kind", "idempotency_key"],
        "((idempotency_key IS NOT NULL) AND (idempotency_key !~~ 'outbox:%'::text))",
    )
    assert got["ix_job_dispatch"] == (
        False,
        ["status", "priority", "available_at"],
        "(status = 'pending'::mdm.job_status)",
    )
    assert got["ix_job_claimed_stale"] == (
        False,
        ["claimed_at"],
        "(status = 'running'::mdm.job_status)",
    )
    assert got["ix_job_tenant_kind"] == (False, ["tenant_id", "job_kind", "status"], None)


def test_audit_table_exists(migrated: Engine) -> None:
    with migrated.connect() as conn:
        cols = {name for name, *_ in columns(conn, "mdm.aa_job_audit")}
    assert {"job_id", "tenant_id", "job_kind", "action", "actor", "detail", "created_at"} <= cols


def test_no_business_trigger_on_aa_job(migrated: Engine) -> None:
    # The seed: state changes happen in code only.
    with migrated.connect() as conn:
        triggers = conn.execute(
            text(
                "SELECT tgname FROM pg_trigger "
                "WHERE tgrelid = 'mdm.aa_job'::regclass AND NOT tgisinternal"
            )
        ).all()
    assert triggers == []


# --- models and migrations agree ------------------------------------------------------------


def _import_models() -> None:
    for name in SCHEMA_MODULES:
        if importlib.util.find_spec(name.rsplit(".", 1)[0]) and importlib.util.find_spec(name):
            importlib.import_module(name)


def schema_diff(conn: Connection) -> list:
    """What autogenerate would write to bring the database to the models (options as env.py)."""
    _import_models()
    context = MigrationContext.configure(
        conn,
        opts={
            "target_metadata": metadata,
            "version_table": VERSION_TABLE,
            "version_table_schema": SCHEMA,
            "include_schemas": True,
            "include_name": lambda name, type_, parent: type_ != "schema" or name == SCHEMA,
            "compare_type": True,
            "compare_server_default": True,
        },
    )
    return [d for d in compare_metadata(context, metadata) if VERSION_TABLE not in repr(d)]


def test_models_agree_with_migrations(migrated: Engine) -> None:
    with migrated.connect() as conn:
        diff = schema_diff(conn)
    assert diff == [], "models and migrations differ:\n" + "\n".join(map(repr, diff))


def test_model_comparison_notices_a_difference(migrated: Engine) -> None:
    # Guards the test above against passing vacuously (wrong schema filter, no models loaded).
    with migrated.connect() as conn:
        conn.execute(text("DROP INDEX mdm.ix_job_tenant_kind"))
        conn.execute(text("ALTER TABLE mdm.aa_job ALTER COLUMN priority SET DEFAULT 50"))
        diff = repr(schema_diff(conn))
        conn.rollback()
    assert "ix_job_tenant_kind" in diff
    assert "priority" in diff


# --- the history runs both ways -------------------------------------------------------------


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
