"""Pure parts of webhook delivery: signing, the status-code decision, Retry-After, the
address guard, URL validation. No database, no network."""

from __future__ import annotations

import ipaddress
import json
import math
import ssl
from datetime import UTC, datetime

import pytest

from postrelay.core.errors import ValidationError
from postrelay.relay.webhooks import EndpointDirectory, signing, webhook_handler
from postrelay.relay.webhooks.endpoints import _event_types
from postrelay.relay.webhooks.handler import message_body
from postrelay.relay.webhooks.netguard import is_public
from postrelay.relay.webhooks.responses import parse_retry_after, verdict
from postrelay.relay.webhooks.trust import CaContexts
from postrelay.relay.webhooks.urls import validate_url
from tests.webhooks.receiver import verify_standard_webhook

# The example of the Standard Webhooks specification and its reference libraries.
VECTOR = {
    "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
    "timestamp": 1614265330,
    "body": b'{"test": 2432232314}',
    "signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
}
NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def test_signing_reproduces_the_published_vector() -> None:
    got = signing.sign(VECTOR["secret"], VECTOR["id"], VECTOR["timestamp"], VECTOR["body"])
    assert got == VECTOR["signature"]


def test_verifier_accepts_the_published_vector() -> None:
    headers = {"webhook-id": VECTOR["id"], "webhook-timestamp": str(VECTOR["timestamp"]),
               "webhook-signature": "v1,bm9wZQ== " + VECTOR["signature"]}
    assert verify_standard_webhook(VECTOR["secret"], headers, VECTOR["body"],
                                   now=VECTOR["timestamp"])
    assert not verify_standard_webhook(VECTOR["secret"], headers, VECTOR["body"] + b" ",
                                       now=VECTOR["timestamp"])
    assert not verify_standard_webhook(VECTOR["secret"], headers, VECTOR["body"],
                                       now=VECTOR["timestamp"] + 301)  # replayed too late


def test_new_secrets_are_whsec_base64_of_32_random_bytes() -> None:
    a, b = signing.new_secret(), signing.new_secret()
    assert a != b and a.startswith("whsec_")
    assert len(signing.secret_key(a)) == 32


@pytest.mark.parametrize("secret", ["nope", "whsec_!!!", "whsec_" + "QUJD"])
def test_bad_secrets_are_refused(secret: str) -> None:
    with pytest.raises(ValidationError):
        signing.secret_key(secret)


@pytest.mark.parametrize(
    ("status", "retry_after", "action", "delay"),
    [
        (200, None, "delivered", None),
        (204, None, "delivered", None),
        (299, None, "delivered", None),
        (410, "5", "gone", None),
        (429, "7", "retry", 7.0),
        (429, None, "retry", None),  # no Retry-After: the worker's backoff
        (502, "Sun, 30 Nov 2026 12:00:30 GMT", "retry", 30.0),
        (503, "garbage", "retry", None),
        (504, "99999", "retry", 3600.0),  # capped
        (500, "5", "retry", None),  # Retry-After only counts for 429/502/503/504
        (501, None, "retry", None),
        (400, None, "permanent", None),
        (401, None, "permanent", None),
        (404, None, "permanent", None),
        (413, None, "permanent", None),
        (301, None, "permanent", None),  # redirects are not followed
        (307, None, "permanent", None),
    ],
)
def test_verdict_for_every_status_class(status, retry_after, action, delay) -> None:
    got = verdict(status, retry_after, NOW)
    assert (got.action, got.delay_secs) == (action, delay)


def test_retry_after_dates_in_the_past_mean_now() -> None:
    assert parse_retry_after("Sun, 30 Nov 2026 11:00:00 GMT", NOW) == 0.0
    assert parse_retry_after(" 12 ", NOW) == 12.0
    assert parse_retry_after("-3", NOW) is None
    assert parse_retry_after("\u0663", NOW) is None  # ARABIC-INDIC DIGIT THREE: not DIGIT
    assert parse_retry_after("", NOW) is None


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("100.64.0.1", False),  # carrier-grade NAT
        ("0.0.0.0", False),
        ("224.0.0.1", False),  # multicast
        ("::1", False),
        ("fe80::1", False),
        ("fc00::1", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped
        ("2002:7f00:1::", False),  # 6to4 of 127.0.0.1
        ("64:ff9b::a00:1", False),  # NAT64 of 10.0.0.1
        ("64:ff9b::808:808", True),  # NAT64 of 8.8.8.8
        # Every IPv4-embedding form is judged as the IPv4 address it embeds (issue 18).
        ("::7f00:1", False),  # IPv4-compatible ::127.0.0.1
        ("::127.0.0.1", False),
        ("::a00:1", False),  # IPv4-compatible 10.0.0.1
        ("::808:808", True),  # IPv4-compatible 8.8.8.8
        ("::ffff:0:7f00:1", False),  # IPv4-translated 127.0.0.1
        ("::ffff:0:a9fe:a9fe", False),  # IPv4-translated 169.254.169.254
        ("::ffff:0:808:808", True),
        ("::ffff:10.0.0.1", False),  # IPv4-mapped, dotted
        ("::ffff:a9fe:a9fe", False),  # IPv4-mapped metadata address, hex
        ("::ffff:8.8.8.8", True),
        ("64:ff9b::7f00:1", False),  # NAT64 of 127.0.0.1
        ("64:ff9b::a9fe:a9fe", False),  # NAT64 of 169.254.169.254
        ("64:ff9b:1::808:808", False),  # local-use NAT64: where the IPv4 sits is unknown
        ("64:ff9b:1:ffff::1", False),
        ("2002:a00:1::1", False),  # 6to4 of 10.0.0.1
        ("2002:808:808::1", True),  # 6to4 of 8.8.8.8
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", False),  # Teredo, client 127.0.0.1
        ("2001:0:7f00:1::", False),  # Teredo, server 127.0.0.1
        ("fec0::1", False),  # deprecated site-local
        ("feff::1", False),
        ("2606:4700:4700::1111", True),  # a public IPv6 address
    ],
)
def test_address_guard(address: str, public: bool) -> None:
    assert is_public(ipaddress.ip_address(address)) is public


def test_message_body_is_the_standard_envelope_and_deterministic() -> None:
    created = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)
    body = message_body("order.placed", {"b": 1, "a": "ü"}, created)
    assert body == message_body("order.placed", {"b": 1, "a": "ü"}, created)
    assert json.loads(body) == {"type": "order.placed", "timestamp": "2026-11-30T12:00:00.123456Z",
                                "data": {"b": 1, "a": "ü"}}


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("ftp://example.com/x", "scheme"),
        ("example.com/hook", "scheme"),
        ("https:///nohost", "host"),
        ("https://user:pw@example.com/", "credentials"),
        ("https://example.com/#frag", "fragment"),
        ("https://example.com:99999/", "valid URL"),
        ("https://exa mple.com/", "whitespace"),
        ("", "non-empty"),
        # What httpx cannot parse, or what the resolver would read as another address.
        ("http://0177.0.0.1:8000/x", "valid URL"),
        ("http://\u2460\u2461\u2466.0.0.1:8000/x", "valid URL"),
        ("http://2130706433/x", "IPv4"),
        ("http://127.1/x", "IPv4"),
        ("http://0x7f.0.0.1/x", "IPv4"),
        ("http://8.8.8.010/x", "IPv4"),
        ("http://ex%41mple.com/x", "host name"),
        ("http://-example.com/x", "host name"),
        ("http://[fe80::1%25eth0]/x", "zone"),
        ("http://[::1/x", "valid URL"),
        ("http://example.com:/x", "port"),
        ("http://example.com:+80/x", "port"),
        ("http://example.com:080/x", "port"),
        ("http://example.com:0/x", "port"),
        ("http://example.com:65536/x", "port"),
        ("http://example.com:80:80/x", "port"),
        ("http://user@example.com/x", "credentials"),
        ("http://:pw@example.com/x", "credentials"),
        ("http://example.com\\@evil.example/x", "backslash"),
        ("https://example.com/#", "fragment"),
        # Loopback and private addresses, in every spelling, unless allowed.
        ("http://127.0.0.1:8000/x", "public"),
        ("http://[::1]:8000/x", "public"),
        ("http://[::7f00:1]:8000/x", "public"),
        ("http://[::ffff:127.0.0.1]:8000/x", "public"),
        ("http://[::ffff:0:7f00:1]:8000/x", "public"),
        ("http://[64:ff9b::7f00:1]:8000/x", "public"),
        ("http://[64:ff9b:1::1]:8000/x", "public"),
        ("http://[2002:7f00:1::1]:8000/x", "public"),
        ("http://[2001:0:4136:e378:8000:63bf:80ff:fffe]:8000/x", "public"),
        ("http://[fec0::1]:8000/x", "public"),
        ("http://169.254.169.254/latest/meta-data", "public"),
        ("http://localhost:8000/x", "loopback"),
        ("http://api.localhost/x", "loopback"),
    ],
)
def test_bad_urls_are_refused_with_the_rule(url: str, rule: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_url(url)
    assert info.value.field == "url" and rule in info.value.rule


def test_good_urls_and_event_type_filters() -> None:
    assert validate_url(" https://example.com:8443/hooks?x=1 ") == \
        "https://example.com:8443/hooks?x=1"
    # Stored as httpx reads and sends it: IDNA host, default port dropped, path normalised.
    assert validate_url("HTTPS://B\u00fccher.Example:443/a/../in?\u00e4=1") == \
        "https://xn--bcher-kva.example/in?%C3%A4=1"
    assert validate_url("http://[2606:4700::1111]:8080/x") == "http://[2606:4700::1111]:8080/x"
    assert validate_url("http://my_service:8080/x") == "http://my_service:8080/x"
    assert validate_url("http://127.0.0.1:8000/x", allow_private=True) == \
        "http://127.0.0.1:8000/x"
    assert validate_url("http://localhost:8000/x", allow_private=True) == \
        "http://localhost:8000/x"
    for bad in ("http://0177.0.0.1:8000/x", "http://[::1%25lo]/x", "http://a@localhost/"):
        with pytest.raises(ValidationError):
            validate_url(bad, allow_private=True)  # allowed or not, never ambiguous
    assert _event_types(None) is None and _event_types([]) is None
    assert _event_types(["order.*", "order.*", "user.created"]) == ["order.*", "user.created"]
    with pytest.raises(ValidationError):
        _event_types("order.*")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        _event_types(["has space"])


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"refresh_secs": 0}, "refresh_secs"),  # reloaded without pause
    ({"refresh_secs": math.nan}, "refresh_secs"),
    ({"max_stale_secs": -1}, "max_stale_secs"),
    # Older than allowed between two good reloads: every event failed, then died.
    ({"refresh_secs": 5.0, "max_stale_secs": 2.0}, "max_stale_secs"),
])
def test_an_endpoint_directory_that_could_not_route_is_refused(kwargs, field) -> None:
    with pytest.raises(ValueError, match=f"^{field}: must be "):
        EndpointDirectory(None, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"timeout_secs": math.nan}, "timeout_secs"),  # passed `<= 0`, broke every deadline
    ({"timeout_secs": math.inf}, "timeout_secs"),
    ({"timeout_secs": 0}, "timeout_secs"),
    ({"retry_after_cap_secs": -1.0}, "retry_after_cap_secs"),  # a negative wait
    ({"retry_after_cap_secs": math.nan}, "retry_after_cap_secs"),
])
def test_a_webhook_handler_with_odd_limits_is_refused(kwargs, field) -> None:
    with pytest.raises(ValueError, match=f"^{field}: must be "):
        webhook_handler(None, **kwargs)  # type: ignore[arg-type]


def test_the_default_bundle_is_loaded_once_and_verifies() -> None:
    """An httpx client left to build its own context loaded certifi's bundle at every
    delivery (about 20 ms of CPU each, for a plain-HTTP endpoint too): one is kept, and it
    checks certificates and host names as httpx's default does."""
    contexts = CaContexts()
    default = contexts.default()
    assert contexts.default() is default
    assert default.verify_mode is ssl.CERT_REQUIRED and default.check_hostname
    assert default.cert_store_stats()["x509_ca"] > 100  # a public bundle, not an empty store
