"""The SNS signing certificate as a sender may point at it: a SigningCertURL that is no URL,
a certificate without end, one that expires while it is cached. Each is refused (401) and
writes nothing, over real HTTP against a real local HTTPS server on an allowed host."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from tests.api.server import UNTHROTTLED, serve_database
from tests.feedback.conftest import insert_log
from tests.feedback.test_webhook_ses import CA, TOPIC, bounce_note, post, sns
from tests.httpserver import serving_https

LIFETIME = timedelta(seconds=3)


class _Certs(BaseHTTPRequestHandler):
    short_lived: bytes = b""  # the certificate the test of expiry serves

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-pem-file")
        self.end_headers()
        if self.path == "/SimpleNotificationService-short.pem":
            self.wfile.write(type(self).short_lived)
            return
        try:  # /SimpleNotificationService-endless.pem: a body that never ends
            while True:
                self.wfile.write(b"A" * 65536)
        except OSError:
            pass

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def fetching(database_url, tmp_path_factory) -> Iterator[tuple[str, str]]:
    ca_file: Path = tmp_path_factory.mktemp("ca") / "ca.pem"
    CA.cert_pem.write_to_path(str(ca_file))
    with serving_https(_Certs, CA) as certs, serve_database(
            database_url, "svc-key-for-the-sns-certificate-tests-01",
            feedback_ses_topic_arns=TOPIC, feedback_ses_cert_hosts=r"127\.0\.0\.1",
            feedback_ses_ca_file=str(ca_file), **UNTHROTTLED) as api_url:
        yield api_url, certs


@pytest.mark.parametrize("cert_url", [
    "https://[127.0.0.1/SimpleNotificationService-1.pem",   # no URL: an unclosed bracket
    "https://127.0.0.1:https/SimpleNotificationService-1.pem",  # a port that is no number
    "https://127.0.0.1:99999/SimpleNotificationService-1.pem",  # one out of range
])
def test_a_signing_cert_url_that_is_no_url_is_401(fetching, tenant, look, cert_url):
    """It was a 500 (urlsplit's ValueError, httpx's InvalidURL) for anyone who knew the
    topic's ARN, and a 500 has SNS retry a forged message for hours."""
    api_url, _ = fetching
    with httpx.Client(base_url=api_url, timeout=30) as client:
        answer = post(client, sns("Notification", bounce_note("<a@b.example>"),
                                  cert_url=cert_url))
    assert answer.status_code == 401, answer.text
    assert "SigningCertURL" in answer.json()["error"]["message"]
    assert look.feedback() == []


def test_a_certificate_without_end_is_refused_not_read_for_ever(fetching, tenant, look):
    api_url, certs = fetching
    with httpx.Client(base_url=api_url, timeout=20) as client:
        answer = post(client, sns("Notification", bounce_note("<a@b.example>"),
                                  cert_url=f"{certs}/SimpleNotificationService-endless.pem"))
    assert answer.status_code == 401, answer.text
    assert "larger than" in answer.json()["error"]["message"]
    assert look.feedback() == []


def test_a_cached_certificate_is_refused_once_it_expires(fetching, engine, tenant, look):
    """The key of a certificate fetched once was used for as long as the process ran: a
    certificate SNS retired (or one whose key leaked) kept suppressing addresses."""
    api_url, certs = fetching
    cert_url = f"{certs}/SimpleNotificationService-short.pem"
    not_after = datetime.now(UTC).replace(microsecond=0) + LIFETIME
    short = CA.issue_cert("sns.amazonaws.com", key_type=trustme.KeyType.RSA,
                          not_after=not_after)
    _Certs.short_lived = short.cert_chain_pems[0].bytes()
    key = serialization.load_pem_private_key(short.private_key_pem.bytes(), None)
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    with httpx.Client(base_url=api_url, timeout=30) as client:
        note = bounce_note(sent["message_id"])
        assert post(client, sns("Notification", note, cert_url=cert_url,
                                key=key)).status_code == 200
        assert len(look.feedback()) == 1
        time.sleep(max(0.0, (not_after - datetime.now(UTC)).total_seconds()) + 1.5)
        later = bounce_note(sent["message_id"], feedbackId="after-the-certificate-expired")
        answer = post(client, sns("Notification", later, cert_url=cert_url, key=key))
    assert answer.status_code == 401, answer.text
    assert "not valid now" in answer.json()["error"]["message"]
    assert len(look.feedback()) == 1

