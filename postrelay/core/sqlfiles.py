"""Load named SQL blocks (`-- name: job_claim`) from a `.sql` file into `text()` objects.

SQL lives in reviewed `.sql` files, one per table; Python code refers to statements by
name and never glues SQL strings together.
"""

import re
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType

from sqlalchemy import TextClause, text

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def parse_named_sql(source: str) -> dict[str, str]:
    """Split `source` into {name: sql} at each `-- name: x` line."""
    parts = _NAME.split(source)
    statements: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        sql = body.strip().rstrip(";").strip()
        if name in statements:
            raise ValueError(f"duplicate SQL name {name!r}")
        statements[name] = sql
    return statements


def load_queries(package: str, *filenames: str) -> Mapping[str, TextClause]:
    """The named statements of one or more files of `package`, as one mapping; a name may
    appear only once across them."""
    statements: dict[str, TextClause] = {}
    for filename in filenames:
        source = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
        for name, sql in parse_named_sql(source).items():
            if name in statements:
                raise ValueError(f"duplicate SQL name {name!r} in {filename}")
            statements[name] = text(sql)
    return MappingProxyType(statements)
