"""Plain-text tables and JSON for the operator commands.

Stored fields come from tenants and from the network (payloads, idempotency keys, SMTP
replies, errors): everything a command prints goes through `terminal_text`, so a control
character or a bidi override reaches the terminal as a visible escape, never as a
command to it. JSON output is made with `ensure_ascii`, which escapes the same characters
and stays valid JSON.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import typer

CELL_WIDTH = 60
# C0 controls but the newline, DEL, C1 controls, and the characters that reorder text
# (bidi embeddings, overrides and isolates, the Arabic letter mark).
_UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def terminal_text(text: str, *, newlines: bool = True) -> str:
    """`text` with every character that could drive or reorder the terminal written as an
    escape (`\\x1b`, `\\u202e`); a newline kept when `newlines`, else escaped too."""
    escaped = _UNSAFE.sub(_escape, text)
    return escaped if newlines else escaped.replace("\n", "\\n")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def echo(text: str = "", *, err: bool = False) -> None:
    """typer.echo for anything that holds stored data."""
    typer.echo(terminal_text(text), err=err)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(headers), *([cell(v) for v in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def cell(value: Any, *, truncate: bool = True) -> str:
    """One value as text, escaped for the terminal; in a table (`truncate`) on one line and
    at most CELL_WIDTH characters."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    text = str(value)
    if truncate:
        text = terminal_text(text.replace("\n", " "))
        if len(text) > CELL_WIDTH:
            text = text[: CELL_WIDTH - 1] + "…"
        return text
    return terminal_text(text)


def print_json(value: Any) -> None:
    # ensure_ascii (the default, named because it matters): every control and non-ASCII
    # character is a \u escape, so the output is safe on a terminal and valid JSON.
    typer.echo(json.dumps(jsonable(value), indent=2, ensure_ascii=True))


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
    if isinstance(value, Decimal):  # an integer longer than Python prints (jsontext.read_stored)
        return str(value)
    return value
