"""Security headers on every dashboard response, static files and errors included.

A route may set its own policy (the email preview does: it frames untrusted HTML in a
sandbox); this middleware only adds the headers a response does not already carry.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# No inline script or style anywhere: the JavaScript and the CSS are files of the package.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; frame-src 'self'; object-src 'none'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
HEADERS = {
    b"content-security-policy": CSP.encode(),
    b"x-frame-options": b"DENY",
    b"referrer-policy": b"no-referrer",
    b"x-content-type-options": b"nosniff",
    b"cross-origin-opener-policy": b"same-origin",
    b"cross-origin-resource-policy": b"same-origin",
}


class SecurityHeaders:
    """Pure ASGI middleware (no BaseHTTPMiddleware: it would buffer streamed responses)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = scope["path"].startswith(scope.get("root_path", "") + "/static/")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                for name, value in HEADERS.items():
                    if name not in present:
                        headers.append((name, value))
                if b"cache-control" not in present:
                    # Pages hold job data: never kept by the browser or a proxy.
                    headers.append((b"cache-control", b"no-cache" if static else b"no-store"))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)
