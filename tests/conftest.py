"""Shared fixtures: a real PostgreSQL for the whole run, migrated once, cleaned per test.

With POSTRELAY_DATABASE_URL set, a fresh database is created on that server for this run;
without it, an embedded PostgreSQL (pgserver) is started in a temporary folder.
"""

from __future__ import annotations

import os
import ssl
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import hypothesis
import pytest
import trustme
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from postrelay.core.db import libpq_url, sqlalchemy_url, start_embedded
from postrelay.core.migrate import upgrade
from tests.factories import TABLES_TO_CLEAN

# Hypothesis fails an example that runs longer than 200 ms by default: a timed assertion,
# which a busy machine trips. Speed is for the benchmarks to measure (bench/).
hypothesis.settings.register_profile("postrelay", deadline=None)
hypothesis.settings.load_profile("postrelay")

# What a test needs, read from the fixtures it uses: every database fixture rests on
# server_url, and every test that starts postrelay processes gives them worker_env.
DATABASE_FIXTURES = frozenset({"server_url", "database_url"})
PROCESS_FIXTURES = frozenset({"worker_env"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test `pure` or `postgres`, and `processes` when it starts postrelay
    processes (tests/README.md)."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        item.add_marker(pytest.mark.postgres if fixtures & DATABASE_FIXTURES
                        else pytest.mark.pure)
        if fixtures & PROCESS_FIXTURES or item.get_closest_marker("acceptance"):
            item.add_marker(pytest.mark.processes)


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A URL of a PostgreSQL server's maintenance database."""
    given = os.environ.get("POSTRELAY_DATABASE_URL")
    if given:
        yield given
        return
    folder = Path(tempfile.mkdtemp(prefix="postrelay-test-pg-"))
    uri, server = start_embedded(folder / "pgdata")
    yield uri
    server.cleanup()


@pytest.fixture(scope="session")
def database_url(server_url: str) -> Iterator[str]:
    """A fresh database for this test run, migrated to head."""
    name = f"postrelay_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(sqlalchemy_url(server_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = sqlalchemy_url(server_url).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    eng = create_engine(sqlalchemy_url(database_url))
    yield eng
    eng.dispose()


@pytest.fixture(scope="session")
async def async_engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_async_engine(sqlalchemy_url(database_url))
    yield eng
    await eng.dispose()


@pytest.fixture(scope="session")
def libpq(database_url: str) -> str:
    return libpq_url(database_url)


@pytest.fixture
def clean_db(engine: Engine) -> Iterator[None]:
    """Empty every queue table (workers commit from other connections, so a rolled-back
    transaction cannot isolate these tests)."""
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(TABLES_TO_CLEAN)} CASCADE"))
        conn.execute(text("DELETE FROM mdm.aa_cron_entry WHERE name NOT LIKE 'postrelay.%'"))
        conn.execute(text("UPDATE mdm.aa_cron_entry SET last_run = NULL, next_run = NULL, "
                          "failing_since = NULL, last_error = NULL, failure_logged_at = NULL"))
        conn.execute(text("DELETE FROM mdm.aa_tenant WHERE name <> 'system'"))
    yield


@pytest.fixture
def tenant(engine: Engine, clean_db: None) -> uuid.UUID:
    from postrelay.queue import ensure_tenant

    with engine.begin() as conn:
        return ensure_tenant(conn, "acme")


@pytest.fixture
def worker_env(database_url: str) -> dict[str, str]:
    """Environment for a postrelay subprocess that uses this run's database."""
    env = dict(os.environ)
    env["POSTRELAY_DATABASE_URL"] = database_url
    env["PYTHONUNBUFFERED"] = "1"
    return env


# A test certificate authority, and a server context it signed for loopback (SMTP with
# STARTTLS or implicit TLS, the pool's and the inbound receiver's).

@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("smtp-ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


@pytest.fixture(scope="session")
def server_tls(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    return context
