"""Database access: where the database is, and engines to reach it.

With `POSTRELAY_DATABASE_URL` set, everything runs against that server. Without it, an
embedded PostgreSQL (the `pgserver` package) is started on demand in
`POSTRELAY_EMBEDDED_DATA_DIR`; it stops when the last process using it exits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import URL, Engine, MetaData, create_engine, make_url
from sqlalchemy.dialects.postgresql import TIMESTAMP
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from postrelay.core.settings import Settings

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
    from pathlib import Path

    path = Path(data_dir).expanduser().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); pgserver copes.
        warnings.simplefilter("ignore")
        import pgserver  # imported late: only the embedded path needs it

        server = pgserver.get_server(path, cleanup_mode="stop")
    return server.get_uri(), server


@dataclass
class Database:
    """The resolved database: its URL and, when embedded, the server handle that keeps it up."""

    url: URL
    embedded: Any = None
    _engines: list[Engine | AsyncEngine] = field(default_factory=list)

    def sync_engine(self, **kwargs: Any) -> Engine:
        kwargs.setdefault("pool_pre_ping", True)
        engine = create_engine(self.url, **kwargs)
        self._engines.append(engine)
        return engine

    def async_engine(self, **kwargs: Any) -> AsyncEngine:
        kwargs.setdefault("pool_pre_ping", True)
        engine = create_async_engine(self.url, **kwargs)
        self._engines.append(engine)
        return engine

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


def open_database(settings: Settings) -> Database:
    if settings.database_url:
        return Database(url=sqlalchemy_url(settings.database_url))
    uri, server = start_embedded(settings.embedded_data_dir)
    return Database(url=sqlalchemy_url(uri), embedded=server)
