"""JSON request bodies of the admin API, read once and refused when an object repeats a key.

Python's json (and so FastAPI) keeps the last of repeated keys: `{"kind": "a", "kind": "b"}`
was enqueued as `b`, while a proxy, a log or an audit that reads the first saw `a`. Every
router with a JSON body is made with `route_class=JsonBodyRoute`, whose request parses the
body with a hook that refuses a repeated key; the error handler (errors.py) answers 400
naming the key and where it is (`payload.to`, `body[0].kind`).

    router = APIRouter(prefix="/v1/functions/jobs", route_class=JsonBodyRoute)

The hook costs a Python call per object of the body, a few tenths of a microsecond each;
where the key is is worked out only for a body that is refused. The provider webhooks
(routers/feedback.py) read their bodies themselves and take repeated keys as json does:
what is verified there is the exact bytes (SendGrid) or the very fields read (SNS), and
Postmark's basic auth covers no body.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

# The longest key an error message repeats: a key may be as long as the body.
_KEY_CHARS = 100


class RepeatedKeyError(Exception):
    """A JSON object of the body gives `key` more than once; `field` is where, as the API
    names fields (`payload.to`, `items[2].sku`)."""

    def __init__(self, field: str, key: str) -> None:
        super().__init__(f"{field}: given more than once in the same object; give each "
                         "key once")
        self.field = field
        self.key = key


class _Repeated(Exception):
    """Raised by the hook to stop the parse at the first repeated key."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise _Repeated
    return found


_DECODER = json.JSONDecoder(object_pairs_hook=_unique)


class _Repeating(dict[str, Any]):
    """An object of the body as the locating parse keeps it: with its first repeated key."""

    repeated: str


def _marking(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) == len(pairs):
        return found
    marked = _Repeating(found)
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            marked.repeated = key
            break
        seen.add(key)
    return marked


_LOCATOR = json.JSONDecoder(object_pairs_hook=_marking)


def parse_body(body: bytes) -> Any:
    """The value of a JSON body (UTF-8, -16 or -32, as json.loads reads bytes).
    RepeatedKeyError for an object that gives a key twice; json.JSONDecodeError,
    UnicodeDecodeError and RecursionError as json.loads raises them."""
    text = body.decode(json.detect_encoding(body), "surrogatepass")
    try:
        return _DECODER.decode(text)
    except _Repeated:
        raise _located(_LOCATOR.decode(text)) from None


def _located(value: Any) -> RepeatedKeyError:
    """The first object, in the order of the text, that repeats a key. Iterative, so that
    a deep body cannot exhaust the stack."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, _Repeating):
            return RepeatedKeyError(_field(path + _member(item.repeated)), item.repeated)
        if isinstance(item, dict):
            stack.extend(reversed([(path + _member(k), v) for k, v in item.items()]))
        elif isinstance(item, list):
            stack.extend(reversed([(f"{path}[{i}]", v) for i, v in enumerate(item)]))
    raise AssertionError("the hook saw a repeated key the second parse did not")


def _member(key: str) -> str:
    return f".{key}" if key.isidentifier() else f"[{_shown(key)}]"


def _field(path: str) -> str:
    # `kind` at the top; `body[0]` or `body["a b"]` where the path starts with brackets.
    return path[1:] if path.startswith(".") else f"body{path}"


def _shown(key: str) -> str:
    # ASCII, escapes included: a lone surrogate could not be sent back as UTF-8.
    return json.dumps(key if len(key) <= _KEY_CHARS else key[:_KEY_CHARS] + "...")


class JsonBodyRequest(Request):
    """A request whose JSON body is parsed by `parse_body`."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_body(await self.body())
        return self._json


class JsonBodyRoute(APIRoute):
    """A route whose body FastAPI reads through `JsonBodyRequest` (FastAPI's documented way
    to change how a request is read)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def handler(request: Request) -> Response:
            return await handle(JsonBodyRequest(request.scope, request.receive))

        return handler
