"""A minimal HTTP receiver for the webhook benchmark, run as its own process so that its work
does not share the measured process's interpreter:

    python -m bench.http_sink PORT [CERT KEY]

uvicorn serving an ASGI app that reads each request's body and answers 204, over HTTPS with
the certificate and key files given. It prints `ready` once it listens and stops on
SIGTERM.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":  # lifespan: nothing to start or stop
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


class _Ready(uvicorn.Server):
    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        print("ready", flush=True)


def main() -> None:
    port = int(sys.argv[1])
    cert, key = sys.argv[2:4] if len(sys.argv) > 3 else (None, None)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            access_log=False, lifespan="off", ssl_certfile=cert,
                            ssl_keyfile=key)
    _Ready(config).run()


if __name__ == "__main__":
    main()
