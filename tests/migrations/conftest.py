"""Each migration test gets an empty database of its own (`throwaway_database`), and
`migrated` the same database at head."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine

from postrelay.core.db import sqlalchemy_url
from postrelay.core.migrate import upgrade
from tests.migrations import throwaway_database


@pytest.fixture
def empty_url(server_url: str) -> Iterator[str]:
    with throwaway_database(server_url) as url:
        yield url


@pytest.fixture
def empty_engine(empty_url: str) -> Iterator[Engine]:
    eng = create_engine(sqlalchemy_url(empty_url))
    yield eng
    eng.dispose()


@pytest.fixture
def migrated(empty_url: str, empty_engine: Engine) -> Engine:
    upgrade(empty_url)
    return empty_engine
