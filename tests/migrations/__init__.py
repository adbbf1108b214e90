"""Migration tests: each one gets its own empty database on the test server, dropped after.

The session's `database_url` is already migrated, so these tests cannot share it: they need
a database that starts empty, or one they are free to downgrade.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, create_engine, text

from postrelay.core.db import SCHEMA, metadata, sqlalchemy_url
from postrelay.core.migrate import VERSION_TABLE

# The seed's values, in the seed's order (AA_JOB, "Wertebereiche").
SEED_KINDS = [
    "email_send",
    "bulk_import",
    "reindex",
    "outbox_dispatch",
    "cleanup_jobs",
    "virus_scan",
    "index_sync",
    "gin_backfill",
]
SEED_STATUSES = ["pending", "running", "done", "failed", "dlq"]


@contextmanager
def throwaway_database(server_url: str) -> Iterator[str]:
    """Create an empty database on the server of `server_url`; yield its URL; drop it."""
    name = f"postrelay_mig_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(sqlalchemy_url(server_url), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield sqlalchemy_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def pretend_migrated_by_a_newer_postrelay(url: str, revision: str = "0999") -> None:
    """Set the database's migration to one this code does not have, as a newer postrelay
    leaves it."""
    engine = create_engine(sqlalchemy_url(url))
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {SCHEMA}.{VERSION_TABLE} SET version_num = :revision"),
                     {"revision": revision})
    engine.dispose()


def enum_labels(conn, type_name: str) -> list[str]:  # type: ignore[no-untyped-def]
    return list(
        conn.execute(
            text(
                """
                SELECT e.enumlabel
                FROM pg_enum e
                JOIN pg_type t ON t.oid = e.enumtypid
                JOIN pg_namespace n ON n.oid = t.typnamespace
                WHERE n.nspname = 'mdm' AND t.typname = :name
                ORDER BY e.enumsortorder
                """
            ),
            {"name": type_name},
        ).scalars()
    )


def current_revision(conn) -> str | None:  # type: ignore[no-untyped-def]
    from postrelay.core.migrate import VERSION_TABLE

    exists = conn.execute(
        text("SELECT to_regclass(:t) IS NOT NULL"), {"t": f"mdm.{VERSION_TABLE}"}
    ).scalar_one()
    if not exists:
        return None
    return conn.execute(text(f"SELECT version_num FROM mdm.{VERSION_TABLE}")).scalar_one_or_none()


def insert_tenant_and_sent_row(conn: Connection, tenant: uuid.UUID, log: uuid.UUID) -> None:
    """A tenant `acme` and one `sent` log row of it (id `log`) to ann@example.com."""
    conn.execute(text("INSERT INTO mdm.aa_tenant (id, name) VALUES (:t, 'acme')"), {"t": tenant})
    conn.execute(text(
        "INSERT INTO mdm.aa_email_log (id, tenant_id, job_id, template, from_address, "
        "recipients, to_addresses, message_id, status, attempt) VALUES (:l, :t, :l, "
        "'welcome', 'noreply@acme.example', ARRAY['ann@example.com'], "
        "ARRAY['ann@example.com'], '<m@acme.example>', 'sent', 1)"), {"l": log, "t": tenant})


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


# Every module that declares tables; the optional ones are imported when they exist, so a
# table added to the models without a migration (or the reverse) fails the comparison.
SCHEMA_MODULES = (
    "postrelay.queue.schema",
    "postrelay.relay.schema",
    "postrelay.relay.webhooks.schema",
    "postrelay.access.schema",
    "postrelay.orchestrator.schema",
)


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
