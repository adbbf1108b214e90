"""The bound on failed authentication (issue 18): per client address and overall, 429 with
Retry-After for the API and a clear page for the dashboard's sign-in; a correct key from an
address that has been using it is not locked out by other addresses' failures.

The HTTP tests run real servers of their own with small bounds, and reach them from several
loopback source addresses (127.0.0.2, 127.0.0.3, ...: all of 127.0.0.0/8 is this host)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from postrelay.access.throttle import AuthThrottle, client_key
from tests.api.conftest import SERVICE_KEY, data, error
from tests.api.server import serve_database

JOBS = "/v1/functions/jobs"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_each_client_is_bounded_on_its_own_until_its_failures_age_out():
    clock = Clock()
    throttle = AuthThrottle(per_client=3, total=100, window_secs=60, clock=clock)
    for n in range(3):
        assert throttle.check("10.0.0.1") is None
        throttle.failed("10.0.0.1", f"guess-{n}")
        clock.now += 10
    refusal = throttle.check("10.0.0.1")
    assert refusal is not None and not refusal.overall
    assert refusal.retry_after == 30  # the first failure (t=1000) leaves the window at 1060
    assert throttle.check("10.0.0.2") is None  # another address is not affected
    clock.now = 1060.5
    assert throttle.check("10.0.0.1") is None  # one failure aged out: one more try
    throttle.failed("10.0.0.1", "guess-3")
    assert throttle.check("10.0.0.1").retry_after == 10


def test_the_overall_bound_spares_only_addresses_that_just_succeeded_without_failing():
    clock = Clock()
    throttle = AuthThrottle(per_client=5, total=4, window_secs=60, clock=clock)
    throttle.succeeded("10.0.0.9")  # a client using its key
    throttle.succeeded("10.0.0.8")
    throttle.failed("10.0.0.8", "typo")  # ... and one that then failed once
    for attacker in ("10.1.0.1", "10.1.0.2", "10.1.0.3"):
        throttle.failed(attacker, "guess")
    refusal = throttle.check("10.2.0.1")  # a newcomer: refused, whatever key it has
    assert refusal is not None and refusal.overall and refusal.retry_after == 60
    assert "too many failed" in refusal.message
    assert throttle.check("10.1.0.1").overall  # each attacker too (below its own bound)
    assert throttle.check("10.0.0.8") is not None  # failed in the window: not trusted
    assert throttle.check("10.0.0.9") is None  # the working client goes on
    clock.now += TRUST_CHECK_SECS
    assert throttle.check("10.2.0.1") is None  # the window passed: everyone again


TRUST_CHECK_SECS = 61


def test_the_same_wrong_key_again_is_not_another_guess():
    """A service behind a NAT retrying a revoked key, or a webhook with an outdated
    password: counted each time, it locked out every client at that address and, past the
    overall bound, every new client."""
    clock = Clock()
    throttle = AuthThrottle(per_client=3, total=4, window_secs=60, clock=clock)
    for _ in range(50):
        assert throttle.check("10.0.0.1") is None
        throttle.failed("10.0.0.1", "revoked-key")
        clock.now += 0.5
    assert throttle.check("10.2.0.1") is None  # the overall bound: one failure so far
    throttle.failed("10.0.0.1", "guess-1")
    throttle.failed("10.0.0.1", "guess-2")  # distinct keys still count
    refusal = throttle.check("10.0.0.1")
    assert refusal is not None and not refusal.overall
    assert refusal.retry_after == 60  # a key's last failure is the one that counts
    clock.now += 60
    assert throttle.check("10.0.0.1") is None


def test_a_client_is_an_ipv4_address_or_an_ipv6_64():
    assert client_key("192.0.2.7") == "192.0.2.7"
    assert client_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:ffff::9") == \
        "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key(None) == "unknown"
    throttle = AuthThrottle(per_client=2, total=100, window_secs=60)
    throttle.failed("2001:db8:1:2::1", "guess-1")
    throttle.failed("2001:db8:1:2::2", "guess-2")
    assert throttle.check("2001:db8:1:2::3") is not None  # the same /64


# --- over real HTTP --------------------------------------------------------------------


@pytest.fixture
def small_bounds(database_url: str, clean_db: None) -> Iterator[str]:
    """A server of its own: 3 failures per client, 5 in all, in a 30 s window."""
    with serve_database(database_url, SERVICE_KEY, auth_failures_per_client=3,
                        auth_failures_total=5, auth_failure_window_secs=30) as url:
        yield url


def client_from(url: str, address: str) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(base_url=url, transport=transport, timeout=30)


def refused(response: httpx.Response) -> str:
    err = error(response, 429)
    assert err["code"] == "too_many_requests"
    assert 1 <= int(response.headers["retry-after"]) <= 30
    return err["message"]


def test_wrong_keys_from_one_address_get_429_and_do_not_lock_out_another(small_bounds):
    with client_from(small_bounds, "127.0.0.2") as attacker, \
            client_from(small_bounds, "127.0.0.3") as operator:
        for guess in ("guess-1", "guess-2", "guess-3"):
            error(attacker.get(JOBS, headers={"apikey": guess}), 401)
        message = refused(attacker.get(JOBS, headers={"apikey": "guess-4"}))
        assert "from this address" in message
        # Refused before the key is looked at: a right key gets the same answer there.
        refused(attacker.get(JOBS, headers={"apikey": SERVICE_KEY}))
        refused(attacker.get(JOBS, headers={"authorization": f"Bearer {SERVICE_KEY}"}))
        # The operator's address is not affected.
        data(operator.get(JOBS, headers={"apikey": SERVICE_KEY}))
        # No key at all is not a guess: still the usual 401, and never counted.
        error(operator.get(JOBS), 401)


def test_the_overall_bound_spares_a_client_already_using_its_key(small_bounds):
    with client_from(small_bounds, "127.0.0.3") as operator:
        data(operator.get(JOBS, headers={"apikey": SERVICE_KEY}))  # using the API already
        for address in ("127.0.0.4", "127.0.0.5", "127.0.0.6"):  # 2 + 2 + 1 = 5 failures
            with client_from(small_bounds, address) as attacker:
                for n in range(2 if address != "127.0.0.6" else 1):
                    error(attacker.get(JOBS, headers={"apikey": f"nope-{n}"}), 401)
        with client_from(small_bounds, "127.0.0.7") as newcomer:
            message = refused(newcomer.get(JOBS, headers={"apikey": SERVICE_KEY}))
            assert "this installation" in message
        # The address that was using its key goes on while the bound holds ...
        data(operator.get(JOBS, headers={"apikey": SERVICE_KEY}))
        # ... until it fails itself: then it is treated as a newcomer.
        error(operator.get(JOBS, headers={"apikey": "typo"}), 401)
        refused(operator.get(JOBS, headers={"apikey": SERVICE_KEY}))


def test_the_dashboard_sign_in_shares_the_bound_and_says_so(small_bounds):
    with client_from(small_bounds, "127.0.0.8") as browser:
        def attempt(key: str) -> httpx.Response:
            page = browser.get("/dashboard/login")
            token = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
            return browser.post("/dashboard/login", data={"csrf": token, "key": key})

        assert attempt("wrong-1").status_code == 401
        error(browser.get(JOBS, headers={"apikey": "wrong-2"}), 401)  # the API counts too
        assert attempt("wrong-3").status_code == 401
        page = attempt(SERVICE_KEY)
        assert page.status_code == 429 and page.headers["content-type"].startswith("text/html")
        assert 1 <= int(page.headers["retry-after"]) <= 30
        assert "Too many failed sign-in attempts from your address" in page.text
        assert "postrelay_dashboard=" not in page.headers.get("set-cookie", "")
        refused(browser.get(JOBS, headers={"apikey": SERVICE_KEY}))
    with client_from(small_bounds, "127.0.0.9") as other:
        page = other.get("/dashboard/login")
        token = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
        signed_in = other.post("/dashboard/login", data={"csrf": token, "key": SERVICE_KEY})
        assert signed_in.status_code == 303


def test_a_revoked_key_retried_does_not_lock_out_its_neighbours(small_bounds):
    """Services behind one address (a NAT, a cluster's egress): one of them retrying a key
    that no longer works, ten times, and the others' keys still work there."""
    with client_from(small_bounds, "127.0.0.5") as shared:
        for _ in range(10):
            error(shared.get(JOBS, headers={"apikey": "revoked-key"}), 401)
        data(shared.get(JOBS, headers={"apikey": SERVICE_KEY}))
        for guess in ("guess-1", "guess-2"):  # with the revoked key, three distinct
            error(shared.get(JOBS, headers={"apikey": guess}), 401)
        refused(shared.get(JOBS, headers={"apikey": SERVICE_KEY}))
