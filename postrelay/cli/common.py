"""What every command needs: settings from the environment, the database, clean errors."""

from __future__ import annotations

import errno
import getpass
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from sqlalchemy import Connection

from postrelay.cli.boundary import fail
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
    setting (as at start: settings_or_exit). The message goes through the boundary's
    `fail`, escaped: it may repeat what was typed or stored (an address, a category), and
    printed as it came its ESC sequences and bidi overrides reached the terminal."""
    try:
        yield
    except PostrelayError as exc:
        fail(exc)


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


def check_listen(host: str, port: int, host_name: str, port_name: str, *,
                 reuse_port: bool = False) -> None:
    """Bind (without listening) where a server is about to listen, and raise ConfigError
    naming the options when it cannot: a port taken is one line and exit 2 before anything
    starts, not an error from every process of a set. An empty host: every address."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in infos:
            with socket.socket(family, kind, proto) as probe:
                # What asyncio sets on the listener, so the probe fails where it would.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if reuse_port:
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind(address)
    except OSError as exc:
        raise cannot_listen(exc, host, port, host_name, port_name) from None
    except UnicodeError:  # a label longer than 63 characters, as the idna codec says
        raise ConfigError(f"{host_name}: cannot listen on {host!r}: not a host name") from None


def cannot_listen(exc: OSError, host: str, port: int, host_name: str,
                  port_name: str) -> ConfigError:
    """The ConfigError for a listener that could not start on host:port."""
    if isinstance(exc, socket.gaierror):
        return ConfigError(f"{host_name}: cannot listen on {host!r}: {exc.strerror}")
    # asyncio's own text ("error while attempting to bind on address ...") repeats the
    # address; the errno's name says what went wrong.
    reason = (os.strerror(exc.errno) if exc.errno is not None and exc.errno in errno.errorcode
              else str(exc))
    where = f"[{host}]" if ":" in host else (host or "*")
    return ConfigError(f"{host_name} and {port_name}: cannot listen on {where}:{port}: {reason}")
