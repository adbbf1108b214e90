"""The one place where an exception becomes a one-line message and an exit code.

Every command runs inside `GuardedGroup.invoke`, so no command needs its own handling and a
new one cannot forget it: a bad setting exits 2, anything else that went wrong exits 1, each
with one line on stderr. (`postrelay feedback ingest` exits EX_TEMPFAIL when the database
fails: the mail delivery agents that run it retry on that code alone.) A traceback is
logged at DEBUG only (POSTRELAY_LOG_LEVEL=DEBUG).
"""

from __future__ import annotations

import logging
import re
from contextvars import ContextVar
from typing import Any, NoReturn

import typer
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from typer.core import TyperGroup

from postrelay.cli.output import terminal_text
from postrelay.core.errors import ConfigError, PostrelayError, ValidationError

_logger = logging.getLogger("postrelay.cli")
# Raised by typer to end a command on purpose, a usage error (an unknown option, a value
# of the wrong type) among them: typer's to handle, with its usage message and exit 2.
# TyperException is the base of the click exceptions typer carries inside (since 0.26 it
# has its own copy of click, whose classes are not the `click` package's).
_PASS_THROUGH = (typer.Exit, typer.Abort, typer.TyperException)
_FIELD_HEAD = re.compile(r"[A-Za-z_]+")  # `payload` of `payload.to[0]`


# The command running, as the innermost group resolved it: an error names its options.
_COMMAND: ContextVar[Any] = ContextVar("postrelay_cli_command", default=None)


class GuardedGroup(TyperGroup):
    """The root command group, and every group of commands beneath it (`postrelay jobs`):
    runs the command and turns what it raises into `fail`."""

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        _COMMAND.set(command)
        return name, command, rest

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
    if isinstance(exc, ValidationError):
        return 1, _as_typed(exc, _COMMAND.get())
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


def _as_typed(exc: ValidationError, command: Any) -> str:
    """The error naming the option or argument that was typed (`--tenant`), where the
    library named its own field (`tenant_id`); as it came when no parameter matches."""
    head = _FIELD_HEAD.match(exc.field)
    if command is None or head is None:
        return str(exc)
    name = head[0].removesuffix("_id")
    spelled = f"--{name.replace('_', '-')}"
    param = next((param for param in command.params
                  if param.name in (head[0], name) or spelled in param.opts), None)
    if param is None:
        return str(exc)
    typed = (max(param.opts, key=len) if param.param_type_name == "option"
             else param.name.upper())  # an argument, as its help shows it (JOB_ID)
    inside = exc.field[head.end():]
    return f"{typed} ({exc.field}): {exc.rule}" if inside else f"{typed}: {exc.rule}"


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
