"""Every named statement of every layer's `sql/*.sql` is planned against the migrated schema,
so a renamed column or table fails here rather than in production; and every statement is
named by some code, so a dead one cannot linger."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text

import postrelay
from postrelay.core.sqlfiles import parse_named_sql

PACKAGE = Path(postrelay.__file__).parent
SQL_FILES = sorted(PACKAGE.rglob("sql/*.sql"))
STATEMENTS = [
    (path.relative_to(PACKAGE).as_posix(), name, sql)
    for path in SQL_FILES
    for name, sql in parse_named_sql(path.read_text(encoding="utf-8")).items()
]
# Parameters every statement gets as NULL, except where PostgreSQL cannot tell a NULL's type
# from its use (`:limit + :offset`): there a value of the type the code passes.
TYPED_PARAMETERS: dict[str, dict[str, Any]] = {
    "email_log_list_recent": {"limit": 1, "offset": 0},
}
COPY = re.compile(r"^(?:\s*--[^\n]*\n)*\s*COPY\b", re.IGNORECASE)  # after its comments


def test_every_layer_has_its_statements_here():
    layers = {path.relative_to(PACKAGE).parts[0] for path in SQL_FILES}
    assert {"queue", "relay", "orchestrator", "access", "dashboard"} <= layers
    assert len(STATEMENTS) > 100


@pytest.mark.parametrize(("path", "name", "sql"), STATEMENTS,
                         ids=[f"{path}:{name}" for path, name, _ in STATEMENTS])
def test_the_statement_fits_the_schema(engine: Engine, libpq: str, path: str, name: str,
                                       sql: str) -> None:
    if COPY.match(sql):
        # COPY cannot be EXPLAINed: run it with no rows, in a transaction rolled back.
        with psycopg.connect(libpq) as conn:
            with conn.cursor() as cursor, cursor.copy(sql):
                pass
            conn.rollback()
        return
    statement = text(sql)
    params = {key: None for key in statement.compile().params}
    params.update(TYPED_PARAMETERS.get(name, {}))
    with engine.connect() as conn, conn.begin():
        plan = conn.execute(text(f"EXPLAIN {sql}"), params).scalars().all()
        conn.rollback()
    assert plan, f"{path}:{name} has no plan"


def test_every_statement_is_named_by_some_code() -> None:
    code = "\n".join(p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py"))
    unused = [f"{path}:{name}" for path, name, _ in STATEMENTS if f'"{name}"' not in code]
    assert unused == [], "statements no code runs; delete them"
