"""HTTPS with the address pinned: the request goes to the checked IP address, while TLS
still sends the URL's host name (SNI) and verifies the certificate against it."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import threading
from contextlib import AsyncExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from postrelay.relay.webhooks.handler import _send_to_first_reachable
from postrelay.relay.webhooks.netguard import resolve
from postrelay.relay.webhooks.pool import DeliveryClients

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture
def tls_server(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost"], check=True, capture_output=True)
    seen: dict[str, str] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            seen["host"] = self.headers["host"]
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda sock, name, ctx: seen.__setitem__("sni", name)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], cert, seen
    server.shutdown()
    server.server_close()


async def post(host: str, port: int, cert) -> int:
    url = httpx.URL(f"https://{host}:{port}/hook")
    target = await resolve(url.host, port, allow_private=True)
    clients = DeliveryClients()
    async with AsyncExitStack() as held:
        response = await _send_to_first_reachable(
            held, clients, url, port, target, ssl.create_default_context(cafile=str(cert)),
            10.0, {"host": url.netloc.decode()}, b"{}")
        await response.aclose()
    await clients.close()
    return response.status_code


async def test_pinned_https_keeps_sni_and_certificate_check(tls_server):
    port, cert, seen = tls_server
    assert await post("localhost", port, cert) == 204
    assert seen == {"sni": "localhost", "host": f"localhost:{port}"}
    # The same server by its address: the certificate names only "localhost", so the
    # check (made against the URL's host) refuses it.
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        await post("127.0.0.1", port, cert)
