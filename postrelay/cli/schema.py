"""`postrelay migrate` and `postrelay kinds add`: the database schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from sqlalchemy import URL

from postrelay.cli.boundary import GuardedGroup
from postrelay.cli.common import database, settings_or_exit
from postrelay.cli.root import app
from postrelay.core.db import pooler_connect_args, sqlalchemy_url
from postrelay.core.errors import ValidationError

kinds_app = typer.Typer(help="Job kinds (the mdm.job_kind enum).", no_args_is_help=True,
                        cls=GuardedGroup)
app.add_typer(kinds_app, name="kinds")


@app.command("migrate")
def migrate_command(
    sql: bool = typer.Option(False, "--sql", help="Print the SQL for a DBA instead of running it."),
    revision: str = typer.Option("head", help="Target revision."),
) -> None:
    """Create or upgrade everything in schema `mdm`.

    Safe to run twice, or from two processes at once. Connects to
    POSTRELAY_MIGRATE_DATABASE_URL when it is set (past a pooler), else to the database."""
    from postrelay.core import migrate as migrations  # alembic is slow to import

    settings = settings_or_exit()
    try:
        migrations.check_target(revision, sql=sql)
    except ValidationError as exc:
        typer.echo(f"error: --revision: {exc.rule}", err=True)
        raise typer.Exit(2) from None
    if sql:
        # Offline mode needs only the dialect, never a running server.
        url = (settings.migrate_database_url or settings.database_url
               or "postgresql+psycopg://offline/postrelay")
        migrations.upgrade(url, revision, sql=True)
        return
    if settings.migrate_database_url:
        reached = _upgrade(sqlalchemy_url(settings.migrate_database_url), revision, None)
    else:
        with database(settings) as db:
            # Through a transaction pooler the migration is one transaction, which works,
            # but only without server-side prepared statements.
            reached = _upgrade(db.url, revision, pooler_connect_args({}) if db.pooler else None)
    # What the database is at, not the target given: `+1`, or a migration it is past
    # already (migrate never goes back), leave it elsewhere.
    typer.echo(f"database at revision {reached}")


def _upgrade(url: URL, revision: str, connect_args: dict[str, Any] | None) -> str | None:
    from postrelay.core import migrate as migrations

    migrations.upgrade(url, revision, connect_args=connect_args)
    return migrations.database_revision(url, connect_args)


@kinds_app.command("add")
def kinds_add(
    name: str = typer.Argument(..., help="The new job kind, e.g. pdf_render."),
    directory: Path | None = typer.Option(
        None, "--dir", help="Where to write the migration (default: the versions folder)."
    ),
) -> None:
    """Write a migration that adds NAME to mdm.job_kind; run `postrelay migrate` to apply it."""
    from postrelay.core import migrate as migrations

    try:
        path = migrations.write_kind_migration(name, directory)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"wrote {path}")
