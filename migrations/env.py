"""Alembic environment for postrelay.

Migrations run under a transaction-scoped advisory lock, so two processes running
`postrelay migrate` at once take turns: the second finds the schema at head and does nothing.
The SQL `migrate --sql` prints takes the same lock.
"""

from alembic import context
from sqlalchemy import create_engine, pool, text

from postrelay.core.db import SCHEMA, metadata, sqlalchemy_url
from postrelay.core.migrate import MIGRATION_LOCK_KEY, VERSION_TABLE, refuse_unknown

# Importing the schemas fills `metadata` so autogenerate and the model check see every table.
import postrelay.queue.schema  # noqa: F401,E402
import postrelay.access.schema  # noqa: F401,E402
import postrelay.relay.schema  # noqa: F401,E402
import postrelay.relay.webhooks.schema  # noqa: F401,E402
import postrelay.orchestrator.schema  # noqa: F401,E402

config = context.config


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL given to the migration environment")
    return str(url)


def _common() -> dict:
    return {
        "target_metadata": metadata,
        "version_table": VERSION_TABLE,
        "version_table_schema": SCHEMA,
        "include_schemas": True,
        "include_name": lambda name, type_, parent: type_ != "schema" or name == SCHEMA,
        "transaction_per_migration": False,
    }


def run_migrations_offline() -> None:
    # The named paramstyle leaves a `%` in the SQL as written: psycopg's default (pyformat)
    # printed it doubled, and psql ran `LIKE 'outbox:%%'` as given, so the idempotency
    # index's predicate no longer matched the one enqueue's ON CONFLICT names.
    context.configure(url=sqlalchemy_url(_url()), literal_binds=True,
                      dialect_opts={"paramstyle": "named"}, **_common())
    with context.begin_transaction():
        # The printed script takes the lock `postrelay migrate` takes: run while a
        # migration (or a second copy of itself) runs, it waits its turn.
        context.execute(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
        start = context.get_starting_revision_argument()
        if start:
            # A range (`--revision START:END`) changes only a database at START: elsewhere
            # its DDL ran and alembic's version UPDATE matched no row, and the next
            # `postrelay migrate` failed on what the range had made.
            context.execute(_AT_START.format(table=f"{SCHEMA}.{VERSION_TABLE}",
                                             start=start))
        context.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        context.run_migrations()


_AT_START = """DO $guard$
BEGIN
    IF NOT EXISTS (SELECT FROM {table} WHERE version_num = '{start}') THEN
        RAISE EXCEPTION 'this script upgrades a database at migration {start}, '
            'this one is at %; print the range that starts where it is',
            (SELECT coalesce(string_agg(version_num, ', '), 'none') FROM {table});
    END IF;
END
$guard$"""


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is not None:
        _run(connectable)
        return
    engine = create_engine(sqlalchemy_url(_url()), poolclass=pool.NullPool,
                           connect_args=config.attributes.get("connect_args", {}))
    with engine.connect() as connection:
        _run(connection)
    engine.dispose()


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(connection=connection, **_common())
    with context.begin_transaction():
        # Serialise concurrent migrators; released at commit.
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        # Read again under the lock: a newer postrelay may have migrated while we waited.
        refuse_unknown(context.script, context.get_context().get_current_heads())
        connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
