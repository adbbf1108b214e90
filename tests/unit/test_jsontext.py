"""jsontext.encode_rows: what rows record from outside reaches the database storable."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from postrelay.core import jsontext


def test_rows_with_a_nul_or_a_lone_surrogate_get_the_replacement_character() -> None:
    rows = [{"reply": "550 unknown \udce0 user\x00", "id": uuid.UUID(int=1),
             "tags": ["ok", "\ud800"], "key \x00": None}]
    assert json.loads(jsontext.encode_rows(rows)) == [{
        "reply": "550 unknown \ufffd user\ufffd", "id": "00000000-0000-0000-0000-000000000001",
        "tags": ["ok", "\ufffd"], "key \ufffd": None}]


def test_text_jsonb_can_hold_is_left_as_it_is() -> None:
    # A character beyond the BMP is not a lone surrogate; "\\u0000" typed as text is a
    # backslash and five characters, not a NUL.
    rows = [{"a": "grinning \U0001F600", "b": "a backslash: \\u0000 and \\ud800"}]
    assert json.loads(jsontext.encode_rows(rows)) == rows


def test_a_value_json_has_no_type_for_goes_as_its_text() -> None:
    at = datetime(2026, 12, 6, 22, 30, tzinfo=UTC)
    rows = [{"id": uuid.UUID(int=1), "at": at, 7: "seven"}]
    assert jsontext.encode_rows(rows) == (
        '[{"id":"00000000-0000-0000-0000-000000000001","at":"2026-12-06 22:30:00+00:00",'
        '"7":"seven"}]')


def test_an_integer_beyond_64_bits_is_written_as_it_is() -> None:
    rows = [{"asm_group_id": 2**70, "n": -(2**64)}]
    assert json.loads(jsontext.encode_rows(rows)) == rows


def test_a_stored_integer_longer_than_python_converts_is_read_exact() -> None:
    """jsonb keeps integers of any length; Python's conversion stops at 4,300 digits. The
    driver's loader read such a row as a ValueError, failing every listing beside it."""
    digits = "7" * 5000
    value = jsontext.read_stored(f'{{"n": {digits}, "m": -{digits}, "small": 12}}'.encode())
    assert value == {"n": Decimal(digits), "m": Decimal("-" + digits), "small": 12}
    assert type(value["small"]) is int
    assert jsontext.read_stored(b'{"a": [1, 2.5, "x"]}') == {"a": [1, 2.5, "x"]}
    with pytest.raises(json.JSONDecodeError):
        jsontext.read_stored(b'{"a": ')


def test_a_listed_document_nested_too_deep_to_show_reads_as_a_placeholder() -> None:
    """jsonb nests some 15,000 levels; Python's decoder gives out at about 1,000 and the
    API's serializer at 255. The listings' reader shows 200 levels and no more."""
    placeholder = {"_unreadable": "nested more than 200 levels deep: too deep to show"}
    for levels in (201, 1_000, 10_000):
        assert jsontext.read_listed(("[" * levels + "]" * levels).encode()) == placeholder
        assert jsontext.read_listed('{"a": ' + "[" * levels + "]" * levels + "}") == placeholder
    assert jsontext.read_listed("[" * 200 + "]" * 200) is not None
    brackets_in_strings = json.dumps({"s": "[" * 500, "t": ["{"] * 300})
    assert jsontext.read_listed(brackets_in_strings) == json.loads(brackets_in_strings)
    assert jsontext.read_listed('{"n": ' + "7" * 5000 + "}") == {"n": Decimal("7" * 5000)}
