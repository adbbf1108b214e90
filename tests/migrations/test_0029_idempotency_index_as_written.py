"""Migration 0029: a database built from `migrate --sql` output before it printed `%` as
written has an idempotency index whose predicate reads `'outbox:%%'`, and every enqueue
failed on it; the migration rebuilds that index and leaves a right one alone."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.engine import Engine

from postrelay.core.migrate import upgrade
from postrelay.queue import enqueue
from tests.migrations import schema_diff

INDEX_DEF = ("SELECT indexdef FROM pg_indexes WHERE schemaname = 'mdm' "
             "AND indexname = 'job_idempotency_uk'")


def _enqueue_twice(engine: Engine, tenant: uuid.UUID) -> tuple[uuid.UUID, uuid.UUID]:
    with engine.begin() as conn:
        first = enqueue(conn, "reindex", {}, tenant_id=tenant, idempotency_key="once")
        again = enqueue(conn, "reindex", {}, tenant_id=tenant, idempotency_key="once")
    return first, again


def test_0029_rebuilds_the_doubled_index_and_enqueue_works_again(
        empty_url: str, empty_engine: Engine) -> None:
    tenant = uuid.uuid4()
    upgrade(empty_url, "0028")
    with empty_engine.begin() as conn:
        conn.execute(text("INSERT INTO mdm.aa_tenant (id, name) VALUES (:t, 'acme')"),
                     {"t": tenant})
        # The index as psql built it from the doubled script.
        conn.execute(text("DROP INDEX mdm.job_idempotency_uk"))
        # Built inside the server, so that no client-side `%` handling touches the two.
        conn.execute(text(
            "DO $$ BEGIN EXECUTE 'CREATE UNIQUE INDEX job_idempotency_uk ON mdm.aa_job "
            "(tenant_id, job_kind, idempotency_key) WHERE idempotency_key IS NOT NULL "
            "AND idempotency_key NOT LIKE ' || quote_literal('outbox:' || repeat(chr(37), 2)); "
            "END $$"))
        assert "%%" in conn.execute(text(INDEX_DEF)).scalar_one()
    upgrade(empty_url)  # through 0029; the schema is compared with the models at the head
    with empty_engine.connect() as conn:
        assert schema_diff(conn) == []
        assert "%%" not in conn.execute(text(INDEX_DEF)).scalar_one()
    first, again = _enqueue_twice(empty_engine, tenant)
    assert first == again


def test_0029_leaves_a_right_index_as_it_is(empty_url: str, empty_engine: Engine) -> None:
    upgrade(empty_url, "0028")
    with empty_engine.connect() as conn:
        oid = conn.execute(text("SELECT 'mdm.job_idempotency_uk'::regclass::oid")).scalar_one()
    upgrade(empty_url, "0029")
    with empty_engine.connect() as conn:
        assert conn.execute(text(
            "SELECT 'mdm.job_idempotency_uk'::regclass::oid")).scalar_one() == oid
