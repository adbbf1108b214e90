"""Refuse a request body over the size limit before anything reads it.

A payload is at most POSTRELAY_MAX_PAYLOAD_BYTES as JSON (core/limits.py); a body may be
larger by `BODY_ROOM` for the other fields around it. A declared Content-Length over the
limit is answered 413 at once; a chunked body is counted as it arrives and stopped at the
limit, so no endpoint ever buffers more than that.

A body with a Content-Encoding (gzip, say) is refused with 415: nothing here decompresses,
so it would reach the JSON parser as bytes and be refused as "not JSON", which misleads a
client that did send application/json (and a limit counted on compressed bytes would not
bound what a decompressor makes of them).
"""

from __future__ import annotations

from typing import Any

from postrelay.api.errors import error_response

BODY_ROOM = 64 * 1024
# The provider webhooks' bodies are the providers' size, not a payload's (SendGrid batches
# events up to 768 KB).
FEEDBACK_BODY_BYTES = 1024 * 1024


class BodyLimit:
    """ASGI middleware: 413 with the error envelope for a body over `limit` bytes."""

    def __init__(self, app: Any, limit: int, wider: dict[str, int] | None = None) -> None:
        self.app = app
        self.limit = limit
        # Path prefixes whose bodies may be larger (never smaller) than `limit`.
        self.wider = {prefix: max(size, limit) for prefix, size in (wider or {}).items()}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = next((size for prefix, size in self.wider.items()
                      if scope.get("path", "").startswith(prefix)), self.limit)
        declared = _content_length(scope)
        coding = _content_encoding(scope)
        # Only a body that is there: a GET that carries the header by habit has nothing to
        # decode.
        if coding is not None and (declared or _is_chunked(scope)):
            await _refuse_encoding(scope, receive, send, coding)
            return
        if declared is not None and declared > limit:
            await self._refuse(scope, receive, send, limit)
            return
        seen = 0
        refused = False

        async def counted_receive() -> dict[str, Any]:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    # Answer now; the endpoint reading the body sees the client gone, and
                    # whatever it answers to that is dropped.
                    refused = True
                    await self._refuse(scope, receive, send, limit)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: dict[str, Any]) -> None:
            if not refused:
                await send(message)

        await self.app(scope, counted_receive, guarded_send)

    async def _refuse(self, scope: dict[str, Any], receive: Any, send: Any,
                      limit: int) -> None:
        why = "(POSTRELAY_MAX_PAYLOAD_BYTES plus 64 KiB for the other fields)" \
            if limit == self.limit else "(a provider webhook's limit)"
        response = error_response(
            413, "payload_too_large",
            f"request body: over the limit of {limit} bytes {why}",
            headers={"Connection": "close"})
        await response(scope, receive, send)


async def _refuse_encoding(scope: dict[str, Any], receive: Any, send: Any,
                           coding: str) -> None:
    # RFC 9110 15.5.16: 415 for a content coding the server does not take, naming the ones
    # it does in Accept-Encoding.
    response = error_response(
        415, "unsupported_media_type",
        f"Content-Encoding: {coding!r} is not accepted; send the body uncompressed",
        field="Content-Encoding", headers={"Accept-Encoding": "identity"})
    await response(scope, receive, send)


def _content_encoding(scope: dict[str, Any]) -> str | None:
    """The request's content codings other than identity, or None."""
    codings = [coding.strip() for name, value in scope.get("headers", ())
               if name == b"content-encoding"
               for coding in value.decode("latin-1").split(",")]
    others = [coding for coding in codings if coding and coding.lower() != "identity"]
    return ", ".join(others) if others else None


def _is_chunked(scope: dict[str, Any]) -> bool:
    return any(name == b"transfer-encoding" for name, _ in scope.get("headers", ()))


def _content_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
