"""What every command needs: settings from the environment, the database, clean errors."""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from sqlalchemy import Connection

from postrelay.core.db import Database, open_database, pooler_connect_args
from postrelay.core.errors import ConfigError, PostrelayError
from postrelay.core.settings import Settings, load_settings
from postrelay.core.telemetry import configure_logging


def settings_or_exit(**overrides: object) -> Settings:
    try:
        settings = load_settings(**overrides)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    configure_logging(settings.log_level)
    return settings


@contextmanager
def database(settings: Settings) -> Iterator[Database]:
    db = open_database(settings)
    try:
        yield db
    finally:
        db.close()


def require_migrated(db: Database) -> None:
    """Stop a long-running process at start on a database behind this code's migrations
    (a worker or relay on an older schema ran on, failing every round); one a newer
    postrelay migrated is run on with a warning (migrate.require_head)."""
    from postrelay.core import migrate  # alembic is slow to import

    migrate.require_head(db.url, pooler_connect_args({}) if db.pooler else None)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn postrelay's own errors into a one-line message and exit code 1, or 2 for a bad
    setting (as at start: settings_or_exit)."""
    try:
        yield
    except PostrelayError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2 if isinstance(exc, ConfigError) else 1) from None


@contextmanager
def transaction() -> Iterator[Connection]:
    """One committed transaction on the configured database; postrelay errors exit 1."""
    settings = settings_or_exit()
    with user_errors(), database(settings) as db, db.sync_engine().begin() as conn:
        yield conn


def actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry, as in some containers
        user = str(os.getuid())
    return f"cli:{user}@{socket.gethostname()}"
