"""The schema at head, read from PostgreSQL's catalogs: the AA_JOB seed's enums, columns,
keys, checks and indexes, and the models agreeing with what the migrations made."""

from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import Connection, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from tests.migrations import SEED_KINDS, SEED_STATUSES, enum_labels, indexes, schema_diff

SYSTEM_TENANT = uuid.UUID(int=0)


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
