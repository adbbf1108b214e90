"""JSON text as postrelay sends it to the database: compact, made by encoders and a decoder
built once; the rows of a statement's jsonb parameter (`encode_rows`) by orjson.

`json.dumps` with any non-default argument builds a new encoder on every call, and
psycopg's jsonb loader goes through `json.loads` on bytes (an encoding sniff, then a
decode); the hot paths (a payload per enqueued job, emitted event, claimed job and claimed
event) use these shared instances instead. JSON made for people (the CLI, the dashboard)
and the webhook body (UTF-8 on the wire, signed as it is) are formatted where they are made.

`encode_document` also checks what jsonb would refuse, or what postrelay does not accept
(core/limits.py), on the text the encoder made rather than in a second walk over the value:
every non-ASCII character comes out as a `\\uXXXX` escape, so a NUL or a surrogate shows as a
substring, the size is the length, and the bracket count bounds the depth. Only a document
that one of these cheap tests flags is looked at closely.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import orjson

from postrelay.core.errors import PayloadTooLargeError, ValidationError
from postrelay.core.limits import (
    DEPTH_RULE,
    MAX_DEPTH,
    MAX_PAYLOAD_BYTES_ENV,
    NUL_RULE,
    SURROGATE_RULE,
    depth_rule,
    storable,
)

_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
# A payload is any Mapping (the signatures say so): a mapping that is not a dict (a row's
# `_mapping`, a mappingproxy), at the top or inside, is written as the object it reads as.
# `default` is called only for what json has no type for, so a dict costs nothing more.


def _mapping_as_dict(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_DOCUMENT_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False,
                                     default=_mapping_as_dict)

# Rows a statement takes as one jsonb parameter, written for every message sent and every
# report recorded, are made by orjson, which writes them many times faster than json. A
# value JSON has no type for goes as its text (a UUID as orjson writes it, the same as
# `str`; a datetime through `str`), which the statement casts back. Unlike json it writes
# non-ASCII characters as they are, and NaN as null. What it refuses (a lone surrogate, an
# integer beyond 64 bits, which a provider's webhook may carry into a report's detail) goes
# through json, which writes it.
_ROWS_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME
_ROWS_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False, default=str)
_DECODER = json.JSONDecoder()
_LONG_INTEGERS = json.JSONDecoder(parse_int=lambda digits: _int_or_decimal(digits))
# The escapes of the encoder's output that are fine however they look: an escaped
# backslash (so `\\u0000`, a backslash then "u0000", is not taken for a NUL) and a
# surrogate pair (one character beyond the BMP). Deleting them left to right leaves a
# `\u0000` or a `\udXXX` only where the value held a NUL or an unpaired surrogate.
_GOOD_ESCAPES = re.compile(r"\\\\|\\ud[89ab][0-9a-f]{2}\\ud[c-f][0-9a-f]{2}")
# A string, or a run of anything that is neither a bracket nor a quote.
_NOT_BRACKETS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[^\[\]{}"]+')
_SQUARE = str.maketrans("{}", "[]")
# How deep a stored document a listing shows: above MAX_DEPTH, so that a payload postrelay
# accepted still shows inside another document (an email's story, a discarded job's audit
# row), and below what every presenter takes (the API's serializer stops at 255 levels).
LISTED_MAX_DEPTH = 200
UNREADABLE_KEY = "_unreadable"
TOO_DEEP_TO_SHOW = f"nested more than {LISTED_MAX_DEPTH} levels deep: too deep to show"


def encode(value: Any) -> str:
    """`value` as compact JSON; TypeError or ValueError as `json.dumps` raises them (a value
    JSON cannot hold, NaN or an infinity)."""
    return _ENCODER.encode(value)


def encode_rows(rows: Any) -> str:
    """`rows` (or one row's jsonb value) as compact JSON for a statement's parameter, UUIDs
    and datetimes (and anything else JSON has no type for) as their text. What such rows
    record comes partly from outside (an SMTP server's reply, a bounce): a NUL or an
    unpaired surrogate (a byte that was not UTF-8, kept by a `surrogateescape` decode)
    becomes U+FFFD, since jsonb refuses both and one such row would fail the statement of
    every row beside it."""
    try:
        text = orjson.dumps(rows, default=str, option=_ROWS_OPTIONS).decode()
    except orjson.JSONEncodeError:
        text = _ROWS_ENCODER.encode(rows)
    if _bad_escape(text):
        text = _ROWS_ENCODER.encode(_storable(rows))
    return text


def decode(text: str) -> Any:
    """The value of the JSON document `text` (as PostgreSQL prints a jsonb value)."""
    return _DECODER.decode(text)


def read_stored(data: bytes | str) -> Any:
    """A json or jsonb value as the driver receives it (every engine's loader: core/db.py).
    jsonb holds integers of any length, and SQL written by hand may store one longer than
    Python converts (sys.get_int_max_str_digits, a guard against quadratic conversion
    time): the ValueError failed every listing that read its row, the DLQ's included. Such
    a document is read with its long integers exact, as decimal.Decimal (linear to read)."""
    text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError:
        raise
    except ValueError:  # an integer past the conversion limit
        return _LONG_INTEGERS.decode(text)


def read_listed(data: bytes | str) -> Any:
    """`read_stored` for the engines that list rows (the CLI's, the API's, the dashboard's:
    core/db.py). jsonb nests as deep as PostgreSQL's stack allows (some 15,000 levels by
    default); Python's decoder gives out at about 1,000 and the API's serializer at 255, so
    one row written so by hand failed every listing that held it. A document nested more
    than LISTED_MAX_DEPTH levels is read as UNREADABLE_KEY saying why. The worker and the
    relay read their own documents (as text) and dead-letter what they cannot read."""
    text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    if (len(text) > 2 * LISTED_MAX_DEPTH + 1
            and text.count("[") + text.count("{") > LISTED_MAX_DEPTH
            and _deeper_than(text, LISTED_MAX_DEPTH)):
        return {UNREADABLE_KEY: TOO_DEEP_TO_SHOW}
    return read_stored(text)


def _int_or_decimal(digits: str) -> int | Decimal:
    return int(digits) if len(digits.lstrip("-")) <= sys.get_int_max_str_digits() \
        else Decimal(digits)


def encode_document(value: Any, field: str, max_bytes: int,
                    max_depth: int = MAX_DEPTH) -> str:
    """`value` as compact JSON for a jsonb column, or ValidationError naming `field` (and
    the path inside it) and the rule: JSON-serialisable, finite numbers, no NUL, no unpaired
    surrogate, at most `max_depth` levels, at most `max_bytes` bytes
    (PayloadTooLargeError)."""
    try:
        text = _DOCUMENT_ENCODER.encode(value)
    except RecursionError:  # hundreds of levels: the encoder's own recursion gave out
        raise ValidationError(field, depth_rule(max_depth)) from None
    except (TypeError, ValueError) as exc:
        raise ValidationError(field, f"must be JSON-serialisable: {exc}") from None
    if len(text) > max_bytes:  # ASCII only: characters are bytes
        raise PayloadTooLargeError(
            field, f"is {len(text)} bytes as JSON, over the limit of {max_bytes} "
                   f"({MAX_PAYLOAD_BYTES_ENV})")
    if rule := _bad_escape(text):
        path = _find_string(value, lambda s: _bad_escape(_ENCODER.encode(s)) is not None)
        raise ValidationError(field + (path or ""), rule)
    # A text of at most 2 * max_depth + 1 characters cannot nest deeper: a level takes two.
    if (len(text) > 2 * max_depth + 1 and text.count("[") + text.count("{") > max_depth
            and _deeper_than(text, max_depth)):
        raise ValidationError(field, depth_rule(max_depth))
    return text


def parse_document(text: str | bytes, field: str) -> Any:
    """The value of JSON `text` from outside (a CLI option, a file, a provider's webhook;
    bytes in UTF-8, -16 or -32, as json.loads reads them), or ValidationError naming
    `field`: not JSON, nested more than `MAX_DEPTH` levels (past a few hundred the decoder's
    recursion gives out, and what is kept of it could not be encoded again), or holding an
    integer longer than the interpreter converts (a guard against quadratic conversion
    time, which raises ValueError)."""
    try:
        if isinstance(text, bytes):
            text = text.decode(json.detect_encoding(text), "surrogatepass")
        value = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(field, f"not valid JSON: {exc}") from None
    except UnicodeDecodeError:
        raise ValidationError(field, "not valid JSON: not UTF-8, -16 or -32 text") from None
    except RecursionError:
        raise ValidationError(field, DEPTH_RULE) from None
    except ValueError:
        raise ValidationError(field, "must not hold an integer of more than "
                                     f"{sys.get_int_max_str_digits():,} digits") from None
    if _nests_deeper_than(value, MAX_DEPTH):
        raise ValidationError(field, DEPTH_RULE)
    return value


def _nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` nests objects and arrays more than `limit` levels. Iterative, so
    deep values cannot exhaust the stack; only containers are visited."""
    if not isinstance(value, dict | list):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, dict | list))
    return False


def _bad_escape(text: str) -> str | None:
    """The rule a `\\uXXXX` escape of encoder output breaks: a NUL, or a surrogate that is
    not half of a pair (jsonb refuses both); None if every escape is fine. json writes every
    non-ASCII character as a \\u escape (orjson writes them as they are, escapes control
    characters and refuses a lone surrogate), and every escape starts with a backslash:
    text without one, the common case, costs a one-character search (a memchr, many times
    faster than searching for two), and other text two more before the close look."""
    if "\\" not in text or ("\\u0000" not in text and "\\ud" not in text):
        return None
    rest = _GOOD_ESCAPES.sub("", text)
    if "\\u0000" in rest:
        return NUL_RULE
    if "\\ud" in rest:
        return SURROGATE_RULE
    return None


def _storable(value: Any) -> Any:
    """`value` with U+FFFD for each NUL and unpaired surrogate of its strings and keys."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {_storable(key): _storable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(item) for item in value]
    return value


def _deeper_than(text: str, limit: int) -> bool:
    """Whether the JSON `text` nests more than `limit` levels. Each round deletes every
    innermost `[]` (objects count as arrays here), one level, at C speed."""
    brackets = _NOT_BRACKETS.sub("", text).translate(_SQUARE)
    for _ in range(limit):
        if not brackets:
            return False
        brackets = brackets.replace("[]", "")
    return bool(brackets)


def _find_string(value: Any, bad: Any) -> str | None:
    """The path (`.key`, `[index]`) of the first string or key in `value` for which `bad`
    holds; "" for `value` itself. Iterative, so deep values cannot exhaust the stack."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if bad(item):
                return path
        elif isinstance(item, Mapping):
            children = []
            for key, child in item.items():
                if isinstance(key, str) and bad(key):
                    return path + _member(key)
                children.append((path + _member(key), child))
            stack.extend(reversed(children))
        elif isinstance(item, list | tuple):
            stack.extend(reversed([(f"{path}[{i}]", child) for i, child in enumerate(item)]))
    return None


def _member(key: Any) -> str:
    text = str(key)
    return f".{text}" if text.isidentifier() else f"[{_ENCODER.encode(text)}]"
