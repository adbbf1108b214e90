"""Amazon SES notifications through SNS over real HTTP, with the signing certificate fetched
from a real local HTTPS server on an allowed host (once, then cached), and the subscription
handshake's SubscribeURL confirmed there. No network: the test makes its own CA.
"""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.server import UNTHROTTLED, serve_database
from tests.feedback.conftest import insert_log
from tests.feedback.test_webhook_ses import CA, SIGNER, TOPIC, bounce_note, post, sns
from tests.httpserver import serving_https


class _Sns(BaseHTTPRequestHandler):
    """The part of SNS a subscriber talks to: the signing certificate and SubscribeURL."""

    fetched: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).fetched.append(self.path)
        if self.path.startswith("/SimpleNotificationService"):
            body, kind = SIGNER.cert_chain_pems[0].bytes(), "application/x-pem-file"
        elif self.path.startswith("/?Action=ConfirmSubscription"):
            body, kind = b"<ConfirmSubscriptionResponse/>", "text/xml"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def fetching(database_url, tmp_path_factory) -> Iterator[tuple[str, str]]:
    ca_file: Path = tmp_path_factory.mktemp("ca") / "ca.pem"
    CA.cert_pem.write_to_path(str(ca_file))
    with serving_https(_Sns, CA, "127.0.0.1", "localhost") as sns_url, serve_database(
            database_url, "svc-key-for-the-ses-webhook-tests-000003",
            feedback_ses_topic_arns=TOPIC, feedback_ses_cert_hosts=r"127\.0\.0\.1",
            feedback_ses_ca_file=str(ca_file), **UNTHROTTLED) as api_url:
        yield api_url, sns_url


def test_the_certificate_is_fetched_from_an_allowed_host_once_and_the_handshake_confirms(
        fetching, engine, tenant, look):
    api_url, sns_url = fetching
    _Sns.fetched.clear()
    cert_url = f"{sns_url}/SimpleNotificationService-01d088a6f77103d0fe307c0069e40ed6.pem"
    subscribe = f"{sns_url}/?Action=ConfirmSubscription&TopicArn={TOPIC}&Token=2336412f37"
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    with httpx.Client(base_url=api_url, timeout=30) as client:
        handshake = sns("SubscriptionConfirmation", "You have chosen to subscribe to the "
                        f"topic {TOPIC}. To confirm the subscription, visit the SubscribeURL "
                        "included in this message.", cert_url=cert_url, Token="2336412f37",
                        SubscribeURL=subscribe)
        answer = post(client, handshake)
        assert answer.status_code == 200, answer.text
        assert answer.json()["data"] == {"confirmed": True}
        note = sns("Notification", bounce_note(sent["message_id"]), cert_url=cert_url,
                   version="2")
        assert post(client, note).status_code == 200
        # Another host: refused before anything is fetched, for certificates and handshakes.
        elsewhere = cert_url.replace("127.0.0.1", "localhost")
        assert post(client, sns("Notification", bounce_note(sent["message_id"]),
                                cert_url=elsewhere)).status_code == 401
        plain = cert_url.replace("https://", "http://")
        assert post(client, sns("Notification", bounce_note(sent["message_id"]),
                                cert_url=plain)).status_code == 401
        foreign = sns("SubscriptionConfirmation", "confirm", cert_url=cert_url, Token="t",
                      SubscribeURL=subscribe.replace("127.0.0.1", "localhost"))
        assert post(client, foreign).status_code == 401
    confirmations = [p for p in _Sns.fetched if p.startswith("/?Action=ConfirmSubscription")]
    certificates = [p for p in _Sns.fetched if p.startswith("/SimpleNotificationService")]
    assert len(confirmations) == 1
    assert len(certificates) == 1  # cached after the first fetch
    (row,) = look.feedback()
    assert (row["email_log_id"], row["kind"]) == (sent["id"], "bounced")


def test_a_certificate_that_cannot_be_fetched_is_503_so_sns_retries(fetching, tenant, look):
    api_url, sns_url = fetching
    missing = f"{sns_url}/nothing-here.pem"
    with httpx.Client(base_url=api_url, timeout=30) as client:
        answer = post(client, sns("Notification", bounce_note("<a@b.example>"),
                                  cert_url=missing))
    assert answer.status_code == 503, answer.text
    assert look.feedback() == []
