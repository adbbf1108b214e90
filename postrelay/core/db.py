"""Database access: where the database is, and engines to reach it.

With `POSTRELAY_DATABASE_URL` set, everything runs against that server. Without it, an
embedded PostgreSQL (the `pgserver` package) is started on demand in
`POSTRELAY_EMBEDDED_DATA_DIR`; it stops when the last process using it exits.

Behind a transaction pooler (`POSTRELAY_POOLER=transaction`) every engine made here drops
the startup `options` PgBouncer refuses and never prepares statements on the server: each
transaction may run on another server connection, where a prepared statement of this
client is missing or another client's of the same name exists. Engines carry the mode as
the execution option `postrelay_pooler`, so that code holding one can keep its settings
transaction-local (`behind_pooler`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg import errors as pg_errors
from sqlalchemy import URL, Engine, MetaData, create_engine, event, make_url
from sqlalchemy.dialects.postgresql import TIMESTAMP
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from postrelay.core import jsontext
from postrelay.core.errors import ConfigError
from postrelay.core.settings import Settings
from postrelay.core.timestamps import register_infinity

# What a database behind the code's migrations answers: a schema, table, column, type or
# function the code's statements name is missing (the API, the dashboard and the CLI then
# say `postrelay migrate`).
SCHEMA_MISSING = (pg_errors.UndefinedTable, pg_errors.InvalidSchemaName,
                  pg_errors.UndefinedColumn, pg_errors.UndefinedObject,
                  pg_errors.UndefinedFunction)

SCHEMA = "mdm"
metadata = MetaData(schema=SCHEMA)
# Every timestamp in the schema is `timestamptz`.
TIMESTAMPTZ = TIMESTAMP(timezone=True)


def sqlalchemy_url(url: str) -> URL:
    """Any PostgreSQL URL, made to use the psycopg (3) driver."""
    parsed = make_url(url)
    if parsed.drivername in ("postgres", "postgresql", "postgresql+psycopg2"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def libpq_url(url: str | URL) -> str:
    """The same URL for a plain psycopg connection (LISTEN, benchmarks)."""
    parsed = sqlalchemy_url(str(url)) if isinstance(url, str) else url
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def start_embedded(data_dir: Any) -> tuple[str, Any]:
    """Start (or join) the embedded PostgreSQL in `data_dir`; returns its URL and handle."""
    import warnings

    path = Path(data_dir).expanduser().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); pgserver copes.
        warnings.simplefilter("ignore")
        import pgserver  # imported late: only the embedded path needs it

        server = pgserver.get_server(path, cleanup_mode="stop")  # type: ignore[attr-defined]
    return server.get_uri(), server


# libpq waits for a server that accepted the connection but never answers (a firewall or
# proxy that holds it) for as long as the socket lives: a command hung without a word.
# The URL's own connect_timeout, or PGCONNECT_TIMEOUT, wins.
CONNECT_TIMEOUT_SECS = 10


def with_connect_timeout(url: str | URL, connect_args: dict[str, Any] | None) -> dict[str, Any]:
    """`connect_args` with `connect_timeout` when neither they, the URL nor the
    environment give one."""
    args = dict(connect_args or {})
    query = (sqlalchemy_url(url) if isinstance(url, str) else url).query
    if "connect_timeout" not in args and "connect_timeout" not in query \
            and not os.environ.get("PGCONNECT_TIMEOUT"):
        args["connect_timeout"] = CONNECT_TIMEOUT_SECS
    return args


POOLER_OPTION = "postrelay_pooler"
EMBEDDED_DIR_SETTING = "POSTRELAY_EMBEDDED_DATA_DIR"


def behind_pooler(engine: Engine | AsyncEngine) -> bool:
    """Whether `engine` reaches the database through a transaction pooler: then a session
    setting would stay on a server connection that other clients use next."""
    return bool(engine.get_execution_options().get(POOLER_OPTION, False))


def pooler_connect_args(connect_args: dict[str, Any]) -> dict[str, Any]:
    """`connect_args` made fit for a transaction pooler: no startup `options` (the planner
    settings they carry matter only for prepared statements, of which there are none), and
    psycopg's automatic server-side prepared statements off."""
    args = {key: value for key, value in connect_args.items() if key != "options"}
    args["prepare_threshold"] = None
    return args


@dataclass
class Database:
    """The resolved database: its URL and, when embedded, the server handle that keeps it up.
    `pooler`: the URL points at a pooler in transaction mode (POSTRELAY_POOLER)."""

    url: URL
    embedded: Any = None
    pooler: bool = False
    _engines: list[Engine | AsyncEngine] = field(default_factory=list)

    def sync_engine(self, **kwargs: Any) -> Engine:
        # Documents too deep to show read as a placeholder (jsontext.read_listed).
        kwargs.setdefault("json_deserializer", jsontext.read_listed)
        engine = create_engine(self.url, **self._engine_kwargs(kwargs))
        # The CLI's, the API's and the dashboard's: they list rows that SQL written by hand
        # may have set to infinity. Not the async engines of the worker's and the relay's
        # loops, whose every timestamp read would pay for the check.
        event.listen(engine, "connect", _read_infinity)
        self._engines.append(engine)
        return engine

    def async_engine(self, **kwargs: Any) -> AsyncEngine:
        engine = create_async_engine(self.url, **self._engine_kwargs(kwargs))
        self._engines.append(engine)
        return engine

    def _engine_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs.setdefault("pool_pre_ping", True)
        # A statement's error names its parameters otherwise, and errors are logged: a
        # webhook secret, a payload or an address would reach the logs with them.
        kwargs.setdefault("hide_parameters", True)
        kwargs.setdefault("json_deserializer", jsontext.read_stored)
        kwargs["connect_args"] = with_connect_timeout(self.url, kwargs.get("connect_args", {}))
        if self.pooler:
            kwargs["connect_args"] = pooler_connect_args(kwargs.get("connect_args", {}))
            kwargs["execution_options"] = {**kwargs.get("execution_options", {}),
                                           POOLER_OPTION: True}
        return kwargs

    @property
    def libpq_url(self) -> str:
        return libpq_url(self.url)

    def close(self) -> None:
        for engine in self._engines:
            if isinstance(engine, AsyncEngine):
                # Its connections belong to an event loop that may be gone: drop, don't close.
                engine.sync_engine.dispose(close=False)
            else:
                engine.dispose()
        self._engines.clear()


def _read_infinity(connection: Any, _record: Any) -> None:
    register_infinity(connection.adapters)


def open_database(settings: Settings) -> Database:
    pooler = settings.pooler == "transaction"
    if settings.database_url:
        return Database(url=sqlalchemy_url(settings.database_url), pooler=pooler)
    uri, server = start_embedded(_embedded_dir(settings.embedded_data_dir))
    return Database(url=sqlalchemy_url(uri), embedded=server, pooler=pooler)


def _embedded_dir(data_dir: Path) -> Path:
    """`data_dir`, a directory that exists or can be made; ConfigError naming the setting
    otherwise. A file there made initdb fail with a page of its output and a traceback."""
    path = data_dir.expanduser().resolve()
    try:
        if path.exists() and not path.is_dir():
            raise FileExistsError(17, "File exists", str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:  # the path or a folder on the way to it is a file
        raise ConfigError(f"{EMBEDDED_DIR_SETTING}: {exc.filename} is a file, not a "
                          "directory") from None
    except OSError as exc:
        raise ConfigError(f"{EMBEDDED_DIR_SETTING}: cannot make {exc.filename or path}: "
                          f"{exc.strerror or exc}") from None
    # initdb takes only a new or empty folder: other files there made it fail with a page
    # of its output and "unexpected CalledProcessError".
    try:
        foreign = (path.is_dir() and not (path / "PG_VERSION").exists()
                   and any(path.iterdir()))
    except OSError as exc:
        raise ConfigError(f"{EMBEDDED_DIR_SETTING}: cannot read {path}: "
                          f"{exc.strerror or exc}") from None
    if foreign:
        raise ConfigError(f"{EMBEDDED_DIR_SETTING}: {path} holds other files and no "
                          "PostgreSQL data; give a new or empty folder, or an embedded "
                          "PostgreSQL's data folder")
    return path
