"""What PostgreSQL can store, and how much postrelay accepts: the limits every write checks
before it sends anything, so that bad input is a ValidationError and the caller's
transaction stays usable (a value the server refuses aborts the whole transaction).

- Text columns and jsonb cannot hold U+0000 (NUL), and nothing can hold an unpaired
  surrogate (it has no UTF-8 form). Input is refused with a ValidationError; text that
  only records what happened (an error, an SMTP server's reply, a bounce) is made
  storable instead (`storable`): one such value must not keep a whole batch from its
  table.
- A JSON document (a payload, an event's headers) is at most `max_payload_bytes()` bytes as
  postrelay sends it: compact, with every non-ASCII character as a `\\uXXXX` escape. The
  default is 256 KiB; `POSTRELAY_MAX_PAYLOAD_BYTES` changes it.
- A document nests at most `MAX_DEPTH` levels of objects and arrays.
- A job the outbox relay makes from an event may be larger by `ROUTE_ROOM_BYTES` and deeper
  by `ROUTE_ROOM_DEPTH`: its route wraps the event's payload (an `email_send` job carries it
  as its `context`, beside the addresses), and an event that passed the limit when emitted
  must not then fail every routing attempt, and die with its webhooks, for the wrapper.
- Keys that PostgreSQL indexes (idempotency keys, aggregate types and ids) are short enough
  for a btree entry (at most 2,704 bytes) even when every character takes 4 bytes in UTF-8.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import TypeVar

from postrelay.core.errors import ConfigError, ValidationError

T = TypeVar("T")

MAX_PAYLOAD_BYTES_ENV = "POSTRELAY_MAX_PAYLOAD_BYTES"
# SQS and Pub/Sub stop at 256 KiB too: a message, not a blob store. A list answer of 500
# jobs is then bounded as well.
DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024
MIN_MAX_PAYLOAD_BYTES = 1024
MAX_MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
# Far deeper than any real payload, far below the interpreter's recursion limit (the JSON
# encoder and decoder recurse once per level).
MAX_DEPTH = 64
# The wrapper a route may put around an event's payload (see above); as the HTTP API's body
# is allowed 64 KiB around the payload it carries.
ROUTE_ROOM_BYTES = 64 * 1024
ROUTE_ROOM_DEPTH = 4
MAX_KEY_CHARS = 512  # idempotency keys: 512 x 4 bytes fits the unique index
MAX_NAME_CHARS = 255  # event types, aggregate types and ids

NUL_RULE = "must not contain the NUL character (U+0000): PostgreSQL cannot store it"
SURROGATE_RULE = "must not contain an unpaired surrogate (U+D800-U+DFFF): it has no UTF-8 form"
DEPTH_RULE = f"must not nest objects and arrays more than {MAX_DEPTH} levels deep"


def depth_rule(max_depth: int) -> str:
    return DEPTH_RULE if max_depth == MAX_DEPTH else \
        f"must not nest objects and arrays more than {max_depth} levels deep"


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # a NUL or a surrogate


def storable(text: str) -> str:
    """`text` with U+FFFD (the replacement character) for each NUL and unpaired surrogate
    (a byte that was not UTF-8, kept by a `surrogateescape` decode)."""
    if text.isascii() and "\x00" not in text:  # the usual case, at C speed
        return text
    return _UNSTORABLE.sub("\ufffd", text)


def max_payload_bytes() -> int:
    """POSTRELAY_MAX_PAYLOAD_BYTES from the environment, read at call time (default
    256 KiB). Callers that write many documents read it once per batch."""
    raw = os.environ.get(MAX_PAYLOAD_BYTES_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_MAX_PAYLOAD_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = _as_the_settings_read_it(raw)
    if not MIN_MAX_PAYLOAD_BYTES <= value <= MAX_MAX_PAYLOAD_BYTES:
        raise ConfigError(f"{MAX_PAYLOAD_BYTES_ENV}: must be between {MIN_MAX_PAYLOAD_BYTES} "
                          f"and {MAX_MAX_PAYLOAD_BYTES}, got {value}")
    return value


def _as_the_settings_read_it(raw: str) -> int:
    """`raw` read as the settings read it at start (`300000.0` included): a value they took
    failed every write of the process otherwise."""
    import pydantic  # only for the spellings int() does not take

    try:
        return pydantic.TypeAdapter(int).validate_python(raw)
    except pydantic.ValidationError:
        raise ConfigError(
            f"{MAX_PAYLOAD_BYTES_ENV}: must be a whole number of bytes, got {raw!r}"
        ) from None


def checked_text(value: str, field: str, max_chars: int | None = None) -> str:
    """`value` if a text column can hold it, else ValidationError naming `field`. Cheap on
    the hot path: a length, an ASCII flag and a substring search."""
    if (max_chars is None or len(value) <= max_chars) and value.isascii() and "\x00" not in value:
        return value
    if max_chars is not None and len(value) > max_chars:
        raise ValidationError(field, f"must be at most {max_chars} characters, got {len(value)}")
    if "\x00" in value:
        raise ValidationError(field, NUL_RULE)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(field, SURROGATE_RULE) from None
    return value


def checked_created_by(created_by: str | None) -> str | None:
    """A writer's `created_by` as stored: None, or text checked as any stored text is."""
    if created_by is not None and not isinstance(created_by, str):
        raise ValidationError("created_by", "must be a string")
    return None if created_by is None else checked_text(created_by, "created_by")


def each_of(items: Iterable[T], kind: type[T], field: str) -> Iterator[tuple[int, T]]:
    """(index, item) of a batch argument (`events`, `jobs`), each checked to be a `kind`:
    ValidationError naming `field` or `field[i]` otherwise. One item alone, or a string (an
    iterable of letters), is a call that forgot the list."""
    if isinstance(items, kind | str | bytes | Mapping) or not isinstance(items, Iterable):
        raise ValidationError(field, f"must be a list (or any iterable) of {kind.__name__}, "
                                     f"got {type(items).__name__}")
    one = f"{'an' if kind.__name__[0] in 'AEIOU' else 'a'} {kind.__name__}"
    for i, item in enumerate(items):
        if not isinstance(item, kind):
            raise ValidationError(f"{field}[{i}]", f"must be {one}, got {type(item).__name__}")
        yield i, item
