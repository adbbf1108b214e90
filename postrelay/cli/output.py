"""Plain-text tables and JSON for the operator commands."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import typer

CELL_WIDTH = 60


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(headers), *([cell(v) for v in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def cell(value: Any, *, truncate: bool = True) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    text = str(value)
    if truncate:
        text = text.replace("\n", " ")
        if len(text) > CELL_WIDTH:
            text = text[: CELL_WIDTH - 1] + "…"
    return text


def print_json(value: Any) -> None:
    typer.echo(json.dumps(jsonable(value), indent=2))


def jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value
