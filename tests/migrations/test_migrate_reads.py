"""`postrelay migrate` reads the migrations folder once: it read every version file five
times (checking the target, checking the database, alembic's own run, the revision
reached), each read importing every file again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from postrelay.core.migrate import head_revision, migrations_dir
from tests.migrations import throwaway_database
from tests.migrations.test_cli_schema import base_env, run

pytestmark = pytest.mark.processes


def test_migrate_reads_each_migration_file_once(server_url: str, tmp_path: Path) -> None:
    copy = tmp_path / "migrations"
    shutil.copytree(migrations_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    (newest,) = (copy / "versions").glob(f"{head_revision()}_*.py")
    reads = tmp_path / "reads"
    newest.write_text(newest.read_text() + "\nimport os as _os\n\n"
                      "with open(_os.environ['READS_LOG'], 'a') as _log:\n"
                      "    _log.write('read\\n')\n")
    with throwaway_database(server_url) as url:
        done = run("migrate", env=base_env(POSTRELAY_DATABASE_URL=url, READS_LOG=str(reads),
                                           POSTRELAY_MIGRATIONS_DIR=str(copy)))
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"database at revision {head_revision()}\n"
    assert reads.read_text() == "read\n"
