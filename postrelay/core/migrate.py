"""Run the Alembic migrations from code: `postrelay migrate`, tests and the demo use this.

The migrations folder is the repository's `migrations/` in a checkout and
`postrelay/_migrations` inside an installed wheel; `POSTRELAY_MIGRATIONS_DIR` points at
another copy (tests use it so that `postrelay kinds add` never writes into the checkout).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, TextIO

from alembic import command, util
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import URL

import postrelay

VERSION_TABLE = "alembic_version_postrelay"
# Any constant works; it only has to be the same in every migrating process.
MIGRATION_LOCK_KEY = 0x706F_7374_7265  # "postre"
_KIND_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")


def migrations_dir() -> Path:
    override = os.environ.get("POSTRELAY_MIGRATIONS_DIR")
    if override:
        folder = Path(override).expanduser().resolve()
        if not (folder / "env.py").is_file():
            raise FileNotFoundError(f"POSTRELAY_MIGRATIONS_DIR={override}: no env.py there")
        return folder
    package_dir = Path(postrelay.__file__).resolve().parent
    for candidate in (package_dir / "_migrations", package_dir.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("postrelay's migrations folder is missing from this installation")


def alembic_config(
    url: str | URL | None = None,
    *,
    stdout: TextIO | None = None,
    connect_args: dict[str, Any] | None = None,
) -> Config:
    cfg = Config(stdout=stdout) if stdout is not None else Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if url is not None:
        cfg.attributes["url"] = (
            url.render_as_string(hide_password=False) if isinstance(url, URL) else url
        )
    if connect_args:
        cfg.attributes["connect_args"] = connect_args  # migrations/env.py's engine
    return cfg


def upgrade(
    url: str | URL,
    revision: str = "head",
    *,
    sql: bool = False,
    connect_args: dict[str, Any] | None = None,
) -> None:
    """Bring the database to `revision`. With `sql=True`, print the SQL instead."""
    command.upgrade(alembic_config(url, connect_args=connect_args), revision, sql=sql)


def downgrade(url: str | URL, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def write_kind_migration(name: str, directory: Path | None = None) -> Path:
    """Write a migration that adds `name` to the `mdm.job_kind` enum; returns its path.

    PostgreSQL cannot drop an enum value, so the downgrade leaves the value in place.
    """
    if not _KIND_NAME.fullmatch(name):
        raise ValueError(
            f"kind name {name!r}: must be lower-case letters, digits and underscores, "
            "starting with a letter, at most 63 characters"
        )
    cfg = alembic_config()
    version_path = None
    if directory is not None:
        # Alembic finds the head only in its version locations: keep the shipped versions
        # in the list, or the new revision would start a second history (down_revision None).
        version_path = str(Path(directory).resolve())
        shipped = str(migrations_dir() / "versions")
        cfg.set_main_option("path_separator", "os")
        locations = dict.fromkeys([shipped, version_path])  # once each, in order
        cfg.set_main_option("version_locations", os.pathsep.join(locations))
    script = ScriptDirectory.from_config(cfg)
    revision = script.generate_revision(
        util.rev_id(),
        f"add job kind {name}",
        head="head",
        version_path=version_path,
        upgrades=f'op.execute("ALTER TYPE mdm.job_kind ADD VALUE IF NOT EXISTS \'{name}\'")',
        downgrades="# PostgreSQL cannot remove an enum value; the kind stays defined.\n    pass",
    )
    assert revision is not None
    return Path(revision.path)
