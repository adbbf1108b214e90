"""`postrelay migrate --sql --revision START:END`, run by psql, changes only a database at
START: a range run on a database elsewhere applied its DDL and left the version where it
was, so the next `postrelay migrate` failed on what the range had made."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from sqlalchemy import create_engine, text

from postrelay.core.db import sqlalchemy_url
from postrelay.core.migrate import upgrade
from tests.migrations import throwaway_database
from tests.migrations.test_cli_schema import TIMEOUT, UNREACHABLE_URL, base_env, run

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(shutil.which("psql") is None, reason="needs psql"),
]


def psql(url: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "psql",
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            url.replace("postgresql+psycopg://", "postgresql://", 1),
        ],
        input=script,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def state(url: str) -> tuple[str, bool]:
    """The database's migration, and whether 0034's column is there."""
    eng = create_engine(sqlalchemy_url(url))
    try:
        with eng.connect() as conn:
            return (
                conn.execute(
                    text("SELECT version_num FROM mdm.alembic_version_postrelay")
                ).scalar_one(),
                conn.execute(
                    text(
                        "SELECT count(*) FROM information_schema.columns WHERE table_schema "
                        "= 'mdm' AND column_name = 'disabled_by'"
                    )
                ).scalar_one()
                == 1,
            )
    finally:
        eng.dispose()


def test_a_range_script_changes_only_a_database_at_its_start(server_url: str) -> None:
    printed = run(
        "migrate",
        "--sql",
        "--revision",
        "0033:0034",
        env=base_env(POSTRELAY_DATABASE_URL=UNREACHABLE_URL),
    )
    assert printed.returncode == 0, printed.stderr
    with throwaway_database(server_url) as url:
        upgrade(url, "0032")
        refused = psql(url, printed.stdout)
        assert refused.returncode != 0
        assert "this script upgrades a database at migration 0033" in refused.stderr, refused.stderr
        assert state(url) == ("0032", False)  # nothing made
        done = run("migrate", env=base_env(POSTRELAY_DATABASE_URL=url))
        assert done.returncode == 0, done.stderr

    with throwaway_database(server_url) as url:
        upgrade(url, "0033")
        applied = psql(url, printed.stdout)
        assert applied.returncode == 0, applied.stderr
        assert state(url) == ("0034", True)
