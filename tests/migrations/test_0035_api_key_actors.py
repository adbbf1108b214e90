"""Migration 0035: a key's row names who made it and who revoked it; keys made before it
keep working and have nobody recorded."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from postrelay.access import api_key_find, api_key_list, key_hash
from postrelay.core.migrate import downgrade, upgrade
from tests.migrations import schema_diff


def test_0035_keeps_older_keys_and_records_actors_from_now_on(
    empty_url: str, empty_engine: Engine
) -> None:
    tenant = uuid.uuid4()
    upgrade(empty_url, "0034")
    with empty_engine.begin() as conn:
        conn.execute(
            text("INSERT INTO mdm.aa_tenant (id, name) VALUES (:t, 'acme')"), {"t": tenant}
        )
        conn.execute(
            text("INSERT INTO mdm.aa_api_key (name, tenant_id, key_hash) VALUES ('old', :t, :h)"),
            {"t": tenant, "h": key_hash("old-key")},
        )
    upgrade(empty_url)  # through 0035; the schema is compared with the models at the head
    with empty_engine.begin() as conn:
        assert schema_diff(conn) == []
        assert api_key_find(conn, "old-key") == ("old", tenant)
        (old,) = api_key_list(conn)
        assert (old.created_by, old.revoked_by) == (None, None)
    with (
        empty_engine.begin() as conn,
        pytest.raises(IntegrityError, match="api_key_revoked_by_chk"),
    ):
        conn.execute(text("UPDATE mdm.aa_api_key SET revoked_by = 'cli:x@y'"))
    downgrade(empty_url, "0034")  # and back, the key kept
    with empty_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_api_key")).scalar_one() == 1
