"""docs/operations.md's settings table against the Settings model: every setting documented
once, nothing documented that the code does not read, and each default, range and choice as
the code has it, so the two cannot drift apart."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import annotated_types
import pytest
from pydantic.fields import FieldInfo

from postrelay.core.settings import MAX_DAYS, MAX_SECS, Settings

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
# Read from the environment outside the Settings model (core/migrate.py).
OUTSIDE_THE_MODEL = {"migrations_dir"}
# Defaults computed at run time, spelled out in words.
COMPUTED_DEFAULTS = {"embedded_data_dir"}
_NAME = re.compile(r"`POSTRELAY_(\w+)`")
_CODE = re.compile(r"`((?:[^`\\]|\\.)*)`")


def documented() -> dict[str, tuple[str, str, str]]:
    """Each documented setting (lower-case field name) -> its default, range and meaning
    cells; a row naming several settings gives each its comma-separated share."""
    table = OPERATIONS.read_text(encoding="utf-8").split("## Settings", 1)[1]
    table = table.split("\n## ", 1)[0]
    rows: dict[str, tuple[str, str, str]] = {}
    for line in table.splitlines():
        if not line.startswith("| `POSTRELAY_"):
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        assert len(cells) == 4, f"a settings row needs 4 cells: {line[:80]}"
        names = _NAME.findall(cells[0])
        defaults, ranges = (_shares(cell, len(names)) for cell in cells[1:3])
        assert len(defaults) == len(ranges) == len(names), line[:80]
        for name, default, bounds in zip(names, defaults, ranges, strict=True):
            assert name.lower() not in rows, f"POSTRELAY_{name} is documented twice"
            rows[name.lower()] = (default, bounds, cells[3])
    return rows


def _shares(cell: str, count: int) -> list[str]:
    """A cell of a row naming `count` settings: one comma-separated share each, or one
    for all."""
    shares = cell.split(", ") if count > 1 else [cell]
    return shares * count if len(shares) == 1 else shares


def default_text(info: FieldInfo) -> str | None:
    """The default as the table writes it between backticks; None when it is unset."""
    value = info.get_default(call_default_factory=True)
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def range_text(info: FieldInfo) -> str:
    """The range as the table writes it: `a–b` for a closed range, `> 0` or `≥ 0` for a
    time capped at a century (said once above the table), `—` for no numeric bound."""
    low = high = None
    strict = False
    for rule in info.metadata:
        if isinstance(rule, annotated_types.Ge):
            low = rule.ge
        elif isinstance(rule, annotated_types.Gt):
            low, strict = rule.gt, True
        elif isinstance(rule, annotated_types.Le):
            high = rule.le
    if low is None and high is None:
        return "—"
    if high in (MAX_SECS, MAX_DAYS):
        return f"{'>' if strict else '≥'} {low:g}"
    if strict:
        return f"> {low:g}, ≤ {high:g}"
    return f"{low:g}–{high:g}"


def choices(info: FieldInfo) -> tuple[str, ...]:
    return tuple(str(c) for c in typing.get_args(info.annotation)
                 if typing.get_origin(info.annotation) is typing.Literal)


def test_every_setting_is_documented_once_and_every_documented_one_exists() -> None:
    rows = documented()
    assert sorted(set(Settings.model_fields) - set(rows)) == []
    assert sorted(set(rows) - set(Settings.model_fields) - OUTSIDE_THE_MODEL) == []


@pytest.mark.parametrize("field", sorted(Settings.model_fields))
def test_the_documented_default_range_and_choices_are_the_code_s(field: str) -> None:
    info = Settings.model_fields[field]
    default_cell, range_cell, meaning = documented()[field]
    expected = default_text(info)
    written = [code.replace("\\|", "|") for code in _CODE.findall(default_cell)]
    if field in COMPUTED_DEFAULTS:
        assert written, f"POSTRELAY_{field.upper()}: its default is not documented"
    elif expected is None:
        assert written == [], f"POSTRELAY_{field.upper()} is unset by default"
    else:
        assert written[:1] == [expected], f"POSTRELAY_{field.upper()}: default"
    if field == "tenant_weights":  # a mapping: its values' range is in the meaning
        assert "1–1000" in meaning
    range_cell = range_cell.replace("\\|", "|")
    assert range_cell == range_text(info), f"POSTRELAY_{field.upper()}: range"
    for choice in choices(info):
        assert f"`{choice}`" in default_cell + meaning, f"POSTRELAY_{field.upper()}: {choice}"
