"""Run the Alembic migrations from code: `postrelay migrate`, tests and the demo use this.

The migrations folder is the repository's `migrations/` in a checkout and
`postrelay/_migrations` inside an installed wheel; `POSTRELAY_MIGRATIONS_DIR` points at
another copy (tests use it so that `postrelay kinds add` never writes into the checkout).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from alembic import command, util
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import URL, create_engine, pool

import postrelay
from postrelay.core.db import SCHEMA, sqlalchemy_url, with_connect_timeout
from postrelay.core.errors import ConfigError, ConflictError, PostrelayError, ValidationError
from postrelay.core.telemetry import event

VERSION_TABLE = "alembic_version_postrelay"
# Any constant works; it only has to be the same in every migrating process.
MIGRATION_LOCK_KEY = 0x706F_7374_7265  # "postre"
_KIND_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
# Where a migration defines job kinds: the seed's CREATE TYPE (its list may span several
# string literals) and each `kinds add` migration's ADD VALUE.
_KIND_DEFINED = re.compile(r"mdm\.job_kind\s+(?:AS\s+ENUM\s*\(([^)]*)\)"
                           r"|ADD\s+VALUE\s+(?:IF\s+NOT\s+EXISTS\s+)?('[a-z0-9_]+'))")
_QUOTED = re.compile(r"'([a-z0-9_]+)'")
_RELATIVE = re.compile(r"[+-]\d+")


class SchemaRevisionError(PostrelayError):
    """The database is not at the migration this code needs: behind it (run `postrelay
    migrate`), or at one this code does not have (a newer postrelay migrated it)."""


class SchemaAheadError(SchemaRevisionError):
    """The database is at a migration this code does not have: a newer postrelay (or
    migrations folder) migrated it."""


def migrations_dir() -> Path:
    override = os.environ.get("POSTRELAY_MIGRATIONS_DIR")
    if override:
        folder = Path(override).expanduser().resolve()
        if not (folder / "env.py").is_file():
            raise ConfigError(f"POSTRELAY_MIGRATIONS_DIR: {folder} holds no env.py; point it "
                              "at a copy of postrelay's migrations folder")
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


def scripts(cfg: Config | None = None) -> ScriptDirectory:
    """The migrations, every file read: ConfigError naming the file and line of one that
    cannot be loaded (alembic raised a bare SyntaxError for it from deep inside)."""
    script = ScriptDirectory.from_config(cfg or alembic_config())
    try:
        script.get_heads()  # reads every version file
    except SyntaxError as exc:
        raise ConfigError(f"migration file {exc.filename} line {exc.lineno}: {exc.msg}; fix "
                          "or remove it") from None
    except ImportError as exc:
        raise ConfigError(f"a migration file cannot be imported: {exc}") from None
    return script


def upgrade(
    url: str | URL,
    revision: str = "head",
    *,
    sql: bool = False,
    connect_args: dict[str, Any] | None = None,
) -> None:
    """Bring the database to `revision`. With `sql=True`, print the SQL instead.
    SchemaRevisionError, with nothing run, for a database a newer postrelay migrated."""
    script = scripts()
    if not sql:
        connect_args = with_connect_timeout(url, connect_args)
        current = database_revision(url, connect_args)  # alembic would say only "Can't locate"
        if _RELATIVE.fullmatch(revision) and int(revision) >= _steps_to_head(script, current):
            # Past the newest migration: alembic's "didn't produce N migrations". Stop at
            # it, as a target the database is already past leaves it where it is.
            revision = "head"
    command.upgrade(alembic_config(url, connect_args=connect_args), revision, sql=sql)


def _steps_to_head(script: ScriptDirectory, current: str | None) -> int:
    return len(list(script.iterate_revisions("heads", current or "base")))


def check_target(revision: str, *, sql: bool = False) -> None:
    """ValidationError naming `revision` unless it is a target `upgrade` can reach: a
    migration of this code (an id, `head`, `base`), `+N`, or with `sql` a range
    `start:end` of those. Checked before anything runs or is printed: alembic finds a bad
    target only part-way, after the offline SQL has begun."""
    if not revision.strip() or revision != revision.strip():
        raise ValidationError("revision", f"must name a migration such as head, got {revision!r}")
    parts = revision.split(":", 1)
    if len(parts) > 1 and not sql:
        raise ValidationError("revision", "a range start:end works with --sql only")
    script = scripts()
    for part in parts:
        if _RELATIVE.fullmatch(part):
            if part.startswith("-"):
                raise ValidationError("revision", f"{part}: migrate never goes back a migration")
            continue
        try:
            script.get_revisions(part)
        except (util.CommandError, AssertionError):
            raise ValidationError(
                "revision", f"{part!r} is not a migration of this postrelay; give head, +N "
                f"or an id such as {script.get_current_head()}") from None


def database_revision(url: str | URL, connect_args: dict[str, Any] | None = None) -> str | None:
    """The migration the database is at (None before the first); SchemaRevisionError when
    this code does not have it."""
    engine = create_engine(sqlalchemy_url(str(url)) if isinstance(url, str) else url,
                           poolclass=pool.NullPool,
                           connect_args=with_connect_timeout(url, connect_args))
    try:
        with engine.connect() as conn:
            current = MigrationContext.configure(conn, opts={
                "version_table": VERSION_TABLE, "version_table_schema": SCHEMA,
            }).get_current_revision()
    finally:
        engine.dispose()
    if current is not None:
        refuse_unknown(scripts(), (current,))
    return current


def refuse_unknown(script: ScriptDirectory, current: Sequence[str]) -> None:
    """SchemaAheadError when the database is at a migration `script` does not have. Also
    checked by migrations/env.py under the migration lock: a newer postrelay may have
    migrated while this one waited its turn."""
    for revision in current:
        try:
            script.get_revision(revision)
        except util.CommandError:
            raise SchemaAheadError(
                f"the database is at migration {revision}, which this postrelay does not "
                f"have (its newest is {script.get_current_head()}): a newer postrelay "
                "migrated it; run that version or a later one") from None


def require_head(url: str | URL, connect_args: dict[str, Any] | None = None) -> None:
    """SchemaRevisionError when the database is behind this code's newest migration (none
    yet, or an older one): its queries need what the later ones make. A database a newer
    postrelay migrated is run on, with a warning: a release rolled back meets a schema
    ahead of it, and every worker refusing to start then would stop all work."""
    try:
        current = database_revision(url, connect_args)
    except SchemaAheadError as exc:
        event("postrelay.migrate.schema_ahead", logging.WARNING, detail=str(exc))
        return
    head = head_revision()
    if current is None:
        raise SchemaRevisionError("the database has none of postrelay's migrations yet: run "
                                  "`postrelay migrate`")
    if current != head:
        raise SchemaRevisionError(f"the database is at migration {current}, this postrelay "
                                  f"needs {head}: run `postrelay migrate`")


def downgrade(url: str | URL, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str | None:
    return scripts().get_current_head()


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
    script = scripts(cfg)
    defined_in = _kind_defined_in(script, name)
    if defined_in is not None:
        # A second migration would add nothing (IF NOT EXISTS); say so instead of writing it.
        raise ConflictError(f"job kind {name!r} already exists: {defined_in} defines it; "
                            "no migration written")
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


def _kind_defined_in(script: ScriptDirectory, name: str) -> str | None:
    """The migration file in `script`'s history that defines job kind `name`, if any."""
    for revision in script.walk_revisions():
        source = Path(revision.path).read_text(encoding="utf-8")
        for enum, added in _KIND_DEFINED.findall(source):
            if name in _QUOTED.findall(enum or added):
                return revision.path
    return None
