"""What a tenant key is bound to decides what it reaches: a key bound to the system tenant
(made before `postrelay keys add` refused it, or written by hand) reaches nothing."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import Engine, text

from postrelay.access import key_hash
from postrelay.queue import SYSTEM_TENANT_ID
from tests.api.conftest import data, error
from tests.dashboard.conftest import login_token
from tests.factories import insert_job


@pytest.fixture
def system_key(engine: Engine, clean_db: None) -> Iterator[str]:
    """A key row as `keys add --tenant 00000000-…` wrote it before it refused the system
    tenant: the same columns api_key_create fills. (clean_db keeps the system tenant, and
    so its keys: this one is deleted after the test.)"""
    key = secrets.token_urlsafe(32)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO mdm.aa_api_key (name, tenant_id, key_hash) "
                          "VALUES ('old-system-key', :tenant, :hash)"),
                     {"tenant": SYSTEM_TENANT_ID, "hash": key_hash(key)})
    yield key
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM mdm.aa_api_key WHERE name = 'old-system-key'"))


def test_a_key_bound_to_the_system_tenant_opens_nothing(api_url, api, engine, system_key):
    """Its rows are postrelay's own (retention, maintenance): such a key listed them,
    could pause the system tenant and cancel its jobs, and with them retention for every
    tenant."""
    with engine.begin() as conn:
        retention = insert_job(conn, tenant_id=SYSTEM_TENANT_ID, kind="cleanup_jobs")
    with httpx.Client(base_url=api_url, headers={"apikey": system_key}, timeout=30) as system:
        assert error(system.get("/v1/functions/jobs"), 401)["message"] == "invalid API key"
        error(system.post("/v1/functions/pauses", json={}), 401)
        error(system.post(f"/v1/functions/jobs/{retention}/cancel"), 401)
        error(system.get("/v1/functions/outbox/status"), 401)
    assert data(api.get(f"/v1/functions/jobs/{retention}"))["status"] == "pending"
    assert data(api.get("/v1/functions/pauses")) == []


def test_a_key_bound_to_the_system_tenant_does_not_sign_in(api_url, system_key):
    with httpx.Client(base_url=api_url, timeout=30) as browser:
        response = browser.post("/dashboard/login", data={
            "csrf": login_token(browser), "key": system_key, "next": "/"})
        assert response.status_code == 401, response.text
        assert browser.get("/dashboard/jobs").status_code == 303  # to the sign-in page
