"""The outbox_dispatch handler against a real HTTP receiver on loopback: every status-code
class, signatures verified independently, every attempt recorded."""

from __future__ import annotations

import socket
import time
import tracemalloc
import zlib
from email.utils import formatdate

import pytest
from sqlalchemy import text

from postrelay.queue import PermanentError, RetryAfter, StopJob
from postrelay.relay.webhooks import WebhookDeliveryError, webhook_handler
from postrelay.relay.webhooks.netguard import AddressRefused
from tests.webhooks.helpers import (
    add_endpoint,
    as_worker_runs,
    attempts_of,
    dispatch_job,
    emit_event,
    endpoint_state,
    ticking_clock,
)
from tests.webhooks.receiver import Answer


@pytest.fixture
def setup(engine, wh_tenant, receiver):
    """An event, and an endpoint pointing at the receiver (which knows its secret)."""
    endpoint_id, secret = add_endpoint(engine, wh_tenant, receiver.url())
    receiver.secret = secret
    event_id = emit_event(engine, wh_tenant)
    return wh_tenant, event_id, endpoint_id


def throttles(engine) -> list[tuple[str, str, float]]:
    """(key, reason, pause in seconds) of each throttled destination."""
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(  # type: ignore[misc]
            "SELECT key, reason, EXTRACT(EPOCH FROM paused_until - started_at)::float8 "
            "FROM mdm.aa_job_throttle WHERE job_kind = 'outbox_dispatch'"))]


def handler_for(async_engine, **kwargs):
    kwargs.setdefault("allow_private", True)  # the receiver is on loopback
    return as_worker_runs(webhook_handler(async_engine, **kwargs), async_engine)


async def test_2xx_delivers_a_signed_standard_webhook(engine, async_engine, setup, receiver):
    tenant, event_id, endpoint_id = setup
    receiver.program(Answer(204, body=b""))
    await handler_for(async_engine)(dispatch_job(tenant, event_id, endpoint_id))
    (request,) = receiver.requests
    assert request.verified
    assert request.headers["webhook-id"] == f"msg_{event_id}"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["host"] == f"127.0.0.1:{receiver.port}"
    assert b'"type":"order.placed"' in request.body and b'"data":{' in request.body
    (attempt,) = attempts_of(engine, endpoint_id)
    assert (attempt["status_code"], attempt["event_id"], attempt["attempt"]) == (204, event_id, 1)
    assert attempt["error"] is None and attempt["duration_ms"] >= 0


async def test_a_rerun_after_a_recorded_success_does_not_send_again(engine, async_engine, setup,
                                                                  receiver):
    tenant, event_id, endpoint_id = setup
    handler = handler_for(async_engine)
    await handler(dispatch_job(tenant, event_id, endpoint_id))
    await handler(dispatch_job(tenant, event_id, endpoint_id, attempts=2))  # e.g. rescued
    assert len(receiver.requests) == 1 and len(attempts_of(engine, endpoint_id)) == 1


async def test_410_disables_the_endpoint_and_stops_the_job(engine, async_engine, setup, receiver):
    tenant, event_id, endpoint_id = setup
    receiver.program(Answer(410, body=b"gone for good"))
    handler = handler_for(async_engine)
    with pytest.raises(StopJob, match="410"):
        await handler(dispatch_job(tenant, event_id, endpoint_id))
    enabled, reason = endpoint_state(engine, endpoint_id)
    assert not enabled and reason.startswith("410 Gone")
    # Later deliveries to it stop without a request.
    with pytest.raises(StopJob, match="disabled"):
        await handler(dispatch_job(tenant, emit_event(engine, tenant), endpoint_id))
    assert len(receiver.requests) == 1
    assert [a["status_code"] for a in attempts_of(engine, endpoint_id)] == [410]


@pytest.mark.parametrize("status", [429, 502, 503, 504])
async def test_retryable_statuses_honour_retry_after_seconds(engine, async_engine, setup,
                                                             receiver, status):
    tenant, event_id, endpoint_id = setup
    receiver.program(Answer(status, {"Retry-After": "17"}, b"slow down"))
    with pytest.raises(RetryAfter) as info:
        await handler_for(async_engine)(dispatch_job(tenant, event_id, endpoint_id))
    assert info.value.delay_secs == 17.0
    (attempt,) = attempts_of(engine, endpoint_id)
    assert (attempt["status_code"], attempt["response_body"]) == (status, "slow down")
    # 429 and 503 ask senders to slow down: the endpoint is throttled for every worker.
    expected = [(str(endpoint_id), f"HTTP {status}, Retry-After 17 s", pytest.approx(17.0))]
    assert throttles(engine) == (expected if status in (429, 503) else [])


async def test_retry_after_as_an_http_date(engine, async_engine, setup, receiver):
    tenant, event_id, endpoint_id = setup
    start = float(int(time.time()))
    receiver.program(Answer(429, {"Retry-After": formatdate(start + 60, usegmt=True)}))
    with pytest.raises(RetryAfter) as info:
        await handler_for(async_engine, clock=ticking_clock(start))(
            dispatch_job(tenant, event_id, endpoint_id))
    # The clock read start + 1 when the answer was judged (its second reading).
    assert info.value.delay_secs == 59.0
    assert throttles(engine) == [(str(endpoint_id), "HTTP 429, Retry-After 59 s",
                                  pytest.approx(59.0))]


async def test_a_retry_after_of_non_ascii_digits_is_ignored_and_the_attempt_kept(
        engine, async_engine, setup, receiver):
    """"²" is a digit to str.isdigit() but no number to float(): the answer is judged as
    one without Retry-After, not a crash that leaves no attempt in the delivery log."""
    tenant, event_id, endpoint_id = setup
    receiver.program(Answer(503, {"Retry-After": "\u00b2"}, b"busy"))
    with pytest.raises(WebhookDeliveryError, match="HTTP 503") as info:
        await handler_for(async_engine)(dispatch_job(tenant, event_id, endpoint_id))
    assert not isinstance(info.value, RetryAfter)
    assert [a["status_code"] for a in attempts_of(engine, endpoint_id)] == [503]


async def test_503_without_retry_after_uses_the_backoff(engine, async_engine, setup, receiver):
    tenant, event_id, endpoint_id = setup
    receiver.program(503)
    with pytest.raises(WebhookDeliveryError, match="HTTP 503") as info:
        await handler_for(async_engine)(dispatch_job(tenant, event_id, endpoint_id))
    assert not isinstance(info.value, RetryAfter | PermanentError)
    # No Retry-After: the endpoint's deliveries pause for the shortest pause, a second.
    assert throttles(engine) == [(str(endpoint_id), "HTTP 503", pytest.approx(1.0))]


async def test_500_is_retried(engine, async_engine, setup, receiver):
    tenant, event_id, endpoint_id = setup
    receiver.program(Answer(500, body=b"x" * 10_000))
    with pytest.raises(WebhookDeliveryError, match="HTTP 500"):
        await handler_for(async_engine)(dispatch_job(tenant, event_id, endpoint_id))
    (attempt,) = attempts_of(engine, endpoint_id)
    assert attempt["status_code"] == 500 and len(attempt["response_body"]) == 2048  # truncated


@pytest.mark.parametrize("status", [400, 401, 404, 422])
async def test_other_4xx_fail_permanently(engine, async_engine, setup, receiver, status):
    tenant, event_id, endpoint_id = setup
    receiver.program(status)
    with pytest.raises(PermanentError, match=f"HTTP {status}"):
        await handler_for(async_engine)(dispatch_job(tenant, event_id, endpoint_id))
    assert [a["status_code"] for a in attempts_of(engine, endpoint_id)] == [status]


async def test_redirects_are_not_followed(engine, async_engine, setup, receiver):
    tenant, event_id, endpoint_id = setup
    receiver.program(Answer(302, {"Location": receiver.url("/elsewhere")}))
    with pytest.raises(PermanentError, match="HTTP 302"):
        await handler_for(async_engine)(dispatch_job(tenant, event_id, endpoint_id))
    assert [r.path for r in receiver.requests] == ["/hook"]


def deflate_bomb(megabytes: int) -> bytes:
    """`megabytes` MiB of zeros, deflated to about a thousandth of that."""
    z = zlib.compressobj(9)
    zeros = bytes(1 << 20)
    return b"".join(z.compress(zeros) for _ in range(megabytes)) + z.flush()


async def test_a_compressed_answer_is_not_inflated(engine, async_engine, setup, receiver):
    """A receiver's answer was decompressed to keep its first 2 KB: a few hundred KB of
    deflated zeros made each delivery hold tens of megabytes at once, so an endpoint
    could run a worker out of memory. Deliveries ask for no compression, and the body is
    kept as it arrived."""
    tenant, event_id, endpoint_id = setup
    receiver.program(Answer(500, {"Content-Encoding": "deflate"}, deflate_bomb(256)))
    tracemalloc.start()
    try:
        with pytest.raises(WebhookDeliveryError, match="HTTP 500"):
            await handler_for(async_engine)(dispatch_job(tenant, event_id, endpoint_id))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20
    (request,) = receiver.requests
    assert request.headers["accept-encoding"] == "identity"
    (attempt,) = attempts_of(engine, endpoint_id)
    assert attempt["status_code"] == 500 and len(attempt["response_body"]) <= 2048


async def test_connection_refused_is_retried_and_recorded(engine, async_engine, wh_tenant):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint_id, _ = add_endpoint(engine, wh_tenant, f"http://127.0.0.1:{port}/hook")
    event_id = emit_event(engine, wh_tenant)
    with pytest.raises(WebhookDeliveryError, match="ConnectError"):
        await handler_for(async_engine)(dispatch_job(wh_tenant, event_id, endpoint_id))
    (attempt,) = attempts_of(engine, endpoint_id)
    assert attempt["status_code"] is None and "ConnectError" in attempt["error"]


async def test_a_slow_receiver_times_out_and_is_retried(engine, async_engine, setup, receiver):
    tenant, event_id, endpoint_id = setup
    receiver.program(Answer(200, delay_secs=2.0))
    with pytest.raises(WebhookDeliveryError, match="timed out after 0.3 s"):
        await handler_for(async_engine, timeout_secs=0.3)(
            dispatch_job(tenant, event_id, endpoint_id))
    (attempt,) = attempts_of(engine, endpoint_id)
    assert attempt["status_code"] is None and attempt["duration_ms"] < 2000


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_private_addresses_are_refused_unless_allowed(engine, async_engine, wh_tenant,
                                                            receiver, host):
    endpoint_id, secret = add_endpoint(engine, wh_tenant, receiver.url(host=host))
    receiver.secret = secret
    event_id = emit_event(engine, wh_tenant)
    handler = handler_for(async_engine, allow_private=False)  # (its default)
    with pytest.raises(AddressRefused, match="non-public address") as info:
        await handler(dispatch_job(wh_tenant, event_id, endpoint_id))
    assert isinstance(info.value, PermanentError)  # DLQ, no retries burnt
    assert receiver.requests == []
    (attempt,) = attempts_of(engine, endpoint_id)
    assert attempt["status_code"] is None and "POSTRELAY_WEBHOOK_ALLOW_PRIVATE" in attempt["error"]
    # Allowed, the same endpoint is reached, by name (Host header kept) if it was one.
    await handler_for(async_engine)(dispatch_job(wh_tenant, event_id, endpoint_id, attempts=2))
    (request,) = receiver.requests
    assert request.verified and request.headers["host"] == f"{host}:{receiver.port}"


async def test_removed_endpoint_or_missing_event(engine, async_engine, setup, receiver):
    from postrelay.relay.webhooks import webhook_remove

    tenant, event_id, endpoint_id = setup
    handler = handler_for(async_engine)
    other_endpoint, _ = add_endpoint(engine, tenant, receiver.url())
    with pytest.raises(PermanentError, match="no longer exists"):
        await handler(dispatch_job(tenant, event_id.__class__(int=1), other_endpoint))
    with engine.begin() as conn:
        webhook_remove(conn, endpoint_id)
    with pytest.raises(StopJob, match="removed"):
        await handler(dispatch_job(tenant, event_id, endpoint_id))
    with pytest.raises(PermanentError, match="channel"):
        job = dispatch_job(tenant, event_id, other_endpoint)
        await handler(job.__class__(**{**{f: getattr(job, f) for f in job.__slots__},
                                       "payload": {"channel": "kafka"}}))
    assert receiver.requests == []


@pytest.mark.parametrize("url", ["http://0177.0.0.1:8000/x", "http://\u2460\u2461\u2466.0.0.1/x",
                                 "http://example.com:99999/x"])
async def test_a_stored_url_httpx_cannot_use_leaves_an_attempt_and_a_clear_error(
        engine, async_engine, wh_tenant, url):
    """An endpoint stored before `webhooks add` checked URLs (or edited by hand): the job
    stops at once with a one-line error and an attempt row, not a retried traceback."""
    endpoint_id, _ = add_endpoint(engine, wh_tenant, "https://hooks.example.com/in")
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_webhook_endpoint SET url = :u WHERE id = :e"),
                     {"u": url, "e": endpoint_id})
    event_id = emit_event(engine, wh_tenant)
    with pytest.raises(PermanentError, match="cannot be requested") as info:
        await handler_for(async_engine)(dispatch_job(wh_tenant, event_id, endpoint_id))
    assert "Traceback" not in str(info.value) and "\n" not in str(info.value)
    (attempt,) = attempts_of(engine, endpoint_id)
    assert attempt["status_code"] is None and "cannot be requested" in attempt["error"]
