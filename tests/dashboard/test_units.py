"""The dashboard's pure parts: session signing, CSRF tokens, the chart's geometry, and the
formatting filters. No database, no server."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from postrelay.dashboard.chart import nice_ceiling, per_minute
from postrelay.dashboard.filters import duration, query, tenant_name
from postrelay.dashboard.routes.auth import safe_next
from postrelay.dashboard.session import SESSION_SECS, Signer

KEY = b"service-role-key"


def flip(text: str) -> str:
    """`text` with its last character changed (always changed)."""
    return text[:-1] + ("B" if text[-1] == "A" else "A")


def test_a_session_round_trips_and_holds_no_key():
    signer = Signer(KEY)
    key_id, tenant = uuid.uuid4(), uuid.uuid4()
    session = signer.new_session(key_id, tenant)
    cookie = signer.dump(session)
    assert signer.load(cookie) == session
    assert KEY.decode() not in cookie
    service = signer.new_session(None, None)
    assert signer.load(signer.dump(service)) == service


def test_forged_tampered_expired_or_foreign_sessions_are_refused():
    signer = Signer(KEY)
    cookie = signer.dump(signer.new_session(uuid.uuid4(), uuid.uuid4()))
    version, payload, mac = cookie.split(".")
    assert signer.load(f"{version}.{flip(payload)}.{mac}") is None
    assert signer.load(f"{version}.{payload}.{flip(mac)}") is None
    assert signer.load(f"v0.{payload}.{mac}") is None
    assert signer.load("") is None and signer.load(None) is None and signer.load("x.y") is None
    assert Signer(b"another key").load(cookie) is None  # rotating the key ends sessions
    assert signer.load(cookie, now=time.time() + SESSION_SECS + 1) is None


def test_csrf_tokens_belong_to_one_session():
    signer = Signer(KEY)
    one, two = signer.new_session(None, None), signer.new_session(None, None)
    token = signer.csrf_token(one.nonce)
    assert signer.csrf_ok(one.nonce, token)
    assert not signer.csrf_ok(two.nonce, token)
    assert not signer.csrf_ok(one.nonce, None) and not signer.csrf_ok(one.nonce, "")
    assert not Signer(b"other").csrf_ok(one.nonce, token)
    # The cookie's signature is made with another derived key: it is never a CSRF token.
    assert signer.dump(one).split(".")[2] != token


def test_sign_in_tokens_expire():
    signer = Signer(KEY)
    nonce = signer.login_nonce()
    assert signer.login_ok(nonce, signer.csrf_token(nonce))
    stale = f"login:{int(time.time()) - 1}:abc"
    assert not signer.login_ok(stale, signer.csrf_token(stale))
    assert not signer.login_ok(None, "x") and not signer.login_ok("session-nonce", "x")


@pytest.mark.parametrize(("value", "expected"), [
    (0, 5), (3, 5), (5, 5), (6, 10), (11, 20), (20, 20), (21, 50), (99, 100),
    (1234, 2000)])
def test_nice_ceiling(value, expected):
    assert nice_ceiling(value) == expected


def test_chart_bars_scale_to_the_peak_and_stack_failed_on_done():
    start = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    series = [(start + timedelta(minutes=i), 0, 0) for i in range(60)]
    series[10] = (series[10][0], 8, 2)  # peak 10 -> scale 10
    series[59] = (series[59][0], 5, 0)
    chart = per_minute(series)
    assert len(chart.bars) == 60 and (chart.total_done, chart.total_failed) == (13, 2)
    peak, last, empty = chart.bars[10], chart.bars[59], chart.bars[0]
    plot_h = chart.baseline - chart.grid[-1][0]
    assert peak.done_h + peak.failed_h == pytest.approx(plot_h)
    assert peak.failed_y + peak.failed_h == pytest.approx(peak.done_y)  # stacked
    assert last.done_h == pytest.approx(plot_h / 2)
    assert empty.done_h == empty.failed_h == 0
    assert peak.label == "12:10 UTC — 8 done, 2 failed"
    assert [label for _, label in chart.ticks] == ["−45 min", "−30 min", "−15 min", "now"]
    assert [label for _, label in chart.grid] == ["0", "5", "10"]


@pytest.mark.parametrize(("secs", "text"), [
    (None, "—"), (0.25, "250 ms"), (42, "42 s"), (200, "3 m 20 s"), (5 * 3600 + 120, "5 h 02 m"),
    (3 * 86400 + 4 * 3600, "3 d 4 h")])
def test_duration(secs, text):
    assert duration(secs) == text


def test_query_and_tenant_names():
    assert query({"status": "dlq", "kind": "", "tenant": None}, page=2) == "status=dlq&page=2"
    tenant = uuid.uuid4()
    assert tenant_name({tenant: "acme"}, tenant) == "acme"
    assert tenant_name({tenant: "acme"}, str(tenant)) == "acme"  # ids from JSON
    assert tenant_name({}, tenant) == str(tenant)[-8:]


@pytest.mark.parametrize(("target", "expected"), [
    ("/jobs?status=dlq", "/jobs?status=dlq"), ("", "/"), (None, "/"), ("//evil", "/"),
    ("https://evil", "/"), ("/\\evil", "/"), ("/ok\r\nSet-Cookie: x", "/")])
def test_sign_in_goes_back_only_to_dashboard_paths(target, expected):
    assert safe_next(target) == expected


def test_the_dashboard_shows_every_email_status_there_is():
    from postrelay.dashboard.queries import EMAIL_STATUSES as SHOWN
    from postrelay.orchestrator.schema import EMAIL_STATUSES

    assert sorted(SHOWN) == sorted(EMAIL_STATUSES)
