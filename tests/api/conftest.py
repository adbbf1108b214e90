"""The API served for real: uvicorn on loopback, on the test run's migrated database.

One server for the session; `clean_db` (tests/conftest.py) isolates each test's data.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from postrelay.access.keys import api_key_create
from postrelay.queue import ensure_tenant
from tests.api.server import UNTHROTTLED, serve_database

SERVICE_KEY = "svc-" + secrets.token_urlsafe(24)


@pytest.fixture(scope="session")
def api_url(database_url: str) -> Iterator[str]:
    with serve_database(database_url, SERVICE_KEY, **UNTHROTTLED) as url:
        yield url


@pytest.fixture
def api(api_url: str, clean_db: None) -> Iterator[httpx.Client]:
    """httpx on the served API, with the service-role key."""
    with httpx.Client(base_url=api_url, headers={"apikey": SERVICE_KEY}, timeout=30) as client:
        yield client


@pytest.fixture
def anonymous(api_url: str, clean_db: None) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_url, timeout=30) as client:
        yield client


@pytest.fixture
def other_tenant(engine: Engine, tenant: uuid.UUID) -> uuid.UUID:
    with engine.begin() as conn:
        return ensure_tenant(conn, "globex")  # type: ignore[return-value]


def tenant_key(engine: Engine, name: str, tenant_id: uuid.UUID) -> str:
    with engine.begin() as conn:
        _, key = api_key_create(conn, name, tenant_id=tenant_id, actor="test:ops")
    return key


@pytest.fixture
def acme_client(api_url: str, engine: Engine, tenant: uuid.UUID) -> Iterator[httpx.Client]:
    """httpx with a key bound to the `tenant` fixture's tenant (acme), named acme-app."""
    key = tenant_key(engine, "acme-app", tenant)
    with httpx.Client(base_url=api_url, headers={"apikey": key}, timeout=30) as client:
        yield client


def data(response: httpx.Response, status: int = 200) -> Any:
    """The `data` of a successful answer, checking the status and the envelope."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"data", "meta"}, body
    return body["data"]


def error(response: httpx.Response, status: int) -> dict[str, Any]:
    """The `error` of an error answer, checking the status and the envelope."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"data", "error"} and body["data"] is None, body
    assert {"code", "message"} <= set(body["error"]), body
    return body["error"]  # type: ignore[no-any-return]
