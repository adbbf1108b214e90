"""Migration 0021 on a populated database: the outbox relay's keys leave job_idempotency_uk
(its delivery links keep them unique); every other key stays unique per tenant and kind."""

from __future__ import annotations

import pytest
from sqlalchemy import Connection, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from postrelay.core.migrate import downgrade, upgrade
from tests.migrations import indexes, schema_diff


def _job(conn: Connection, tenant: object, key: str) -> None:
    conn.execute(text("INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, idempotency_key) "
                      "VALUES (:t, 'email_send', '{}', :k)"), {"t": tenant, "k": key})


def test_0021_takes_the_relays_keys_out_of_the_unique_index_and_back(
        empty_url: str, empty_engine: Engine) -> None:
    relay_key = "outbox:0193b8a2-7a1c-7e55-9a1e-4d2f1c3b5a61:email:welcome"
    upgrade(empty_url, "0020")
    with empty_engine.begin() as conn:
        tenant = conn.execute(text("INSERT INTO mdm.aa_tenant (name) VALUES ('acme') "
                                   "RETURNING id")).scalar_one()
        _job(conn, tenant, relay_key)
        _job(conn, tenant, "order-7")
    upgrade(empty_url, "0021")
    with empty_engine.connect() as conn:
        unique, _, predicate = indexes(conn, "mdm.aa_job")["job_idempotency_uk"]
        assert unique and "outbox:%" in str(predicate)
        _job(conn, tenant, relay_key)  # the index no longer holds it
        with pytest.raises(IntegrityError, match="job_idempotency_uk"):
            _job(conn, tenant, "order-7")  # a caller's key is still unique
        conn.rollback()
    downgrade(empty_url, "0020")
    with empty_engine.connect() as conn:
        assert indexes(conn, "mdm.aa_job")["job_idempotency_uk"][2] == (
            "(idempotency_key IS NOT NULL)")
        with pytest.raises(IntegrityError, match="job_idempotency_uk"):
            _job(conn, tenant, relay_key)
        conn.rollback()
    upgrade(empty_url)
    with empty_engine.connect() as conn:
        assert schema_diff(conn) == []
