"""What every command needs: settings from the environment, the database, clean errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from postrelay.core.db import Database, open_database
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


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn postrelay's own errors into a one-line message and exit code 1."""
    try:
        yield
    except PostrelayError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
