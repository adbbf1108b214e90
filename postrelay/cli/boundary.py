"""The one place where an exception becomes a one-line message and an exit code.

Every command runs inside `GuardedGroup.invoke`, so no command needs its own handling and a
new one cannot forget it: a bad setting exits 2, anything else that went wrong exits 1, each
with one line on stderr. (`postrelay feedback ingest` exits EX_TEMPFAIL when the database
fails: the mail delivery agents that run it retry on that code alone.) A traceback is
logged at DEBUG only (POSTRELAY_LOG_LEVEL=DEBUG).
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import typer
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from typer.core import TyperGroup

from postrelay.cli.output import terminal_text
from postrelay.core.errors import ConfigError, PostrelayError

_logger = logging.getLogger("postrelay.cli")
# Raised by typer to end a command on purpose, a usage error (an unknown option, a value
# of the wrong type) among them: typer's to handle, with its usage message and exit 2.
# TyperException is the base of the click exceptions typer carries inside (since 0.26 it
# has its own copy of click, whose classes are not the `click` package's).
_PASS_THROUGH = (typer.Exit, typer.Abort, typer.TyperException)


class GuardedGroup(TyperGroup):
    """The root command group: runs the command and turns what it raises into `fail`."""

    # `ctx: Any`: typer declares it with the context class of its private copy of click,
    # which it does not export; nothing here depends on it.
    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except _PASS_THROUGH:
            raise
        except Exception as exc:  # every other path ends in one line, by design
            fail(exc)


def fail(exc: BaseException, code: int | None = None) -> NoReturn:
    """Print `exc` as one line on stderr and exit: `code` when given, else 2 for a bad
    setting and 1 for anything else."""
    _logger.debug("command failed", exc_info=exc)
    described, message = describe(exc)
    typer.echo(f"error: {terminal_text(message, newlines=False)}", err=True)
    raise typer.Exit(described if code is None else code)


def describe(exc: BaseException) -> tuple[int, str]:
    """The exit code and the one-line message for `exc`."""
    if isinstance(exc, ConfigError):
        return 2, str(exc)
    if isinstance(exc, PostrelayError):
        return 1, str(exc)
    if isinstance(exc, DBAPIError):
        return 1, _database_message(exc)
    if isinstance(exc, SQLAlchemyError):
        return 1, f"database: {_first_line(exc)}"
    if isinstance(exc, RecursionError):
        return 1, "input nested too deeply to read"
    if isinstance(exc, OSError):
        return 1, f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    return 1, (f"unexpected {type(exc).__name__}: {_first_line(exc)} "
               "(POSTRELAY_LOG_LEVEL=DEBUG logs the traceback)")


def _database_message(exc: DBAPIError) -> str:
    import psycopg

    from postrelay.core.db import SCHEMA_MISSING

    orig = exc.orig
    detail = _first_line(orig if orig is not None else exc)
    if isinstance(orig, psycopg.OperationalError) or exc.connection_invalidated:
        return f"cannot reach the database: {detail}"
    # A table, column or type the code's queries name is missing: a database behind the
    # code's migrations (a missing column said only "column l.delivery does not exist").
    if isinstance(orig, SCHEMA_MISSING):
        return f"database: {detail} (run `postrelay migrate`)"
    if isinstance(orig, psycopg.DataError):
        return f"invalid value: {detail}"
    return f"database: {detail}"


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
