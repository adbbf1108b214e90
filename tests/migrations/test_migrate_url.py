"""`postrelay migrate` connects to POSTRELAY_MIGRATE_DATABASE_URL when it is set (a direct
connection past a pooler), whatever POSTRELAY_DATABASE_URL says."""

from __future__ import annotations

from sqlalchemy import create_engine

from postrelay.core.db import sqlalchemy_url
from postrelay.core.migrate import head_revision
from tests.migrations import current_revision, throwaway_database
from tests.migrations.test_cli_schema import UNREACHABLE_URL, base_env, run


def test_migrate_uses_the_migrate_url(server_url: str) -> None:
    with throwaway_database(server_url) as url:
        result = run("migrate", env=base_env(POSTRELAY_DATABASE_URL=UNREACHABLE_URL,
                                             POSTRELAY_MIGRATE_DATABASE_URL=url,
                                             POSTRELAY_POOLER="transaction"))
        assert result.returncode == 0, result.stderr
        engine = create_engine(sqlalchemy_url(url))
        try:
            with engine.connect() as conn:
                assert current_revision(conn) == head_revision()
        finally:
            engine.dispose()
