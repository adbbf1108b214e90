"""Migration 0034: endpoints disabled before it are given who disabled them, read from the
reason each kind of disable wrote; a reason nobody can place is an operator's, whom only an
operator overrules. Enabled endpoints have nobody."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from postrelay.core.migrate import downgrade, upgrade
from tests.migrations import schema_diff

REASONS = {
    "enabled": (True, None, None),
    "cli_default": (False, "disabled by an operator", "operator"),
    "cli_own_words": (False, "receiver under attack", "operator"),
    "service_role": (False, "disabled by api:service-role", "operator"),
    "tenant_key": (False, "disabled by api:key:acme-app", "tenant"),
    "gone": (False, "410 Gone at 2026-12-01T10:00:00+00:00", "receiver"),
    "no_reason": (False, None, "operator"),
}


def test_0034_records_who_disabled_each_endpoint(empty_url: str, empty_engine: Engine) -> None:
    tenant = uuid.uuid4()
    upgrade(empty_url, "0033")
    with empty_engine.begin() as conn:
        conn.execute(text("INSERT INTO mdm.aa_tenant (id, name) VALUES (:t, 'acme')"),
                     {"t": tenant})
        for name, (enabled, reason, _) in REASONS.items():
            conn.execute(text(
                "INSERT INTO mdm.aa_webhook_endpoint (tenant_id, url, secret, enabled, "
                "disabled_reason) VALUES (:t, :url, 'whsec_x', :enabled, :reason)"),
                {"t": tenant, "url": f"https://example.com/{name}", "enabled": enabled,
                 "reason": reason})
    upgrade(empty_url)  # through 0034; the schema is compared with the models at the head
    with empty_engine.connect() as conn:
        assert schema_diff(conn) == []
        found = dict(conn.execute(text(
            "SELECT substr(url, 21), disabled_by FROM mdm.aa_webhook_endpoint")).all())
    assert found == {name: by for name, (_, _, by) in REASONS.items()}

    with empty_engine.begin() as conn, pytest.raises(IntegrityError,
                                                     match="disabled_by_enabled_chk"):
        conn.execute(text("UPDATE mdm.aa_webhook_endpoint SET enabled = false "
                          "WHERE disabled_by IS NULL"))
    downgrade(empty_url, "0033")  # and back, the endpoints kept
    with empty_engine.connect() as conn:
        assert conn.execute(text(
            "SELECT count(*) FROM mdm.aa_webhook_endpoint")).scalar_one() == len(REASONS)
