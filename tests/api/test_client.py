"""postrelay.client against the served API: the sync Client and the AsyncClient."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from postrelay.client import ApiConnectionError, ApiError, AsyncClient, Client
from tests.api.conftest import SERVICE_KEY, tenant_key
from tests.factories import insert_job
from tests.httpserver import serving


@pytest.fixture
def client(api_url, clean_db):
    with Client(api_url + "/", SERVICE_KEY) as c:
        yield c


def dead(engine, tenant_id, **fields) -> uuid.UUID:
    with engine.begin() as conn:
        return insert_job(conn, tenant_id=tenant_id, status="dlq", attempts=3, max_attempts=3,
                          completed_at=datetime.now(UTC), **fields)


def test_jobs_round_trip(client, tenant):
    job = client.enqueue_job("reindex", {"month": "2026-10"}, delay_secs=60, max_attempts=3,
                             priority=7, idempotency_key="m-10", tenant_id=tenant)
    assert (job["status"], job["max_attempts"], job["priority"]) == ("pending", 3, 7)
    assert client.get_job(job["id"]) == job
    assert client.get_job(uuid.UUID(job["id"])) == job
    assert client.enqueue_job("reindex", {}, idempotency_key="m-10", tenant_id=tenant) == job
    assert [j["id"] for j in client.list_jobs(status="pending", limit=1)] == [job["id"]]
    assert client.list_jobs(status="dlq") == []


def test_dlq_round_trip(client, engine, tenant):
    first, second, third = (dead(engine, tenant) for _ in range(3))
    assert {j["id"] for j in client.list_dlq()} == {str(first), str(second), str(third)}
    retried = client.retry_job(first)
    assert retried["status"] == "pending" and retried["attempts"] == 3
    assert client.discard_job(second) is None
    assert client.requeue_dlq() == 1
    assert client.requeue_dlq(limit=5) == 0
    assert client.list_dlq() == []


def test_cron_round_trip(client, tenant):
    entry = client.create_cron_job("nightly-cleanup", "0 3 * * *", "bulk_import",
                                   {"dryRun": False}, tenant_id=tenant)
    assert entry["schedule"] == "0 0 3 * * *" and entry["last_run"] is None
    names = [e["name"] for e in client.list_cron_jobs()]
    assert "nightly-cleanup" in names
    assert client.delete_cron_job("nightly-cleanup") is None
    with pytest.raises(ApiError) as info:
        client.delete_cron_job("nightly-cleanup")
    assert (info.value.status, info.value.code) == (404, "not_found")
    assert "nightly-cleanup" in info.value.message


def test_errors_carry_status_code_and_message(client, api_url, tenant):
    with pytest.raises(ApiError) as info:
        client.create_cron_job("daily", "@daily", "reindex", tenant_id=tenant)
    assert (info.value.status, info.value.code, info.value.field) == (400, "invalid_request",
                                                                      "schedule")
    assert "expected 5 fields" in info.value.message
    with pytest.raises(ApiError) as info:
        client.list_jobs(limit=501)
    assert info.value.status == 400 and info.value.field == "limit"
    with pytest.raises(ApiError) as info:
        client.get_job(uuid.uuid4())
    assert info.value.status == 404
    with Client(api_url, "wrong") as stranger, pytest.raises(ApiError) as info:
        stranger.list_jobs()
    assert (info.value.status, info.value.code) == (401, "unauthorized")


async def test_async_client(api_url, engine, tenant, other_tenant):
    key = tenant_key(engine, "acme-async", tenant)
    foreign = dead(engine, other_tenant)
    async with AsyncClient(api_url, key) as api:
        job = await api.enqueue_job("reindex", {"n": 1})
        assert job["tenant_id"] == str(tenant)
        assert (await api.get_job(job["id"]))["id"] == job["id"]
        assert [j["id"] for j in await api.list_jobs()] == [job["id"]]
        assert await api.list_dlq() == []
        assert await api.requeue_dlq() == 0
        with pytest.raises(ApiError) as info:
            await api.get_job(foreign)
        assert info.value.status == 404
        with pytest.raises(ApiError):
            await api.retry_job(foreign)
        with pytest.raises(ApiError):
            await api.discard_job(foreign)
        entry = await api.create_cron_job("every-minute", "*/1 * * * *", "reindex")
        assert entry["schedule"] == "0 */1 * * * *" and entry["tenant_id"] == str(tenant)
        assert [e["name"] for e in await api.list_cron_jobs()] == ["every-minute"]
        await api.delete_cron_job("every-minute")
        assert await api.list_cron_jobs() == []


@contextmanager
def answering(status: int, body: bytes, headers: dict[str, str]) -> Iterator[str]:
    """A stand-in for a proxy in front of the API: every request gets this one answer."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    with serving(ThreadingHTTPServer(("127.0.0.1", 0), Handler)) as url:
        yield url


def free_port() -> int:
    with socket.socket() as free:  # nobody listens on it once this closes
        free.bind(("127.0.0.1", 0))
        port: int = free.getsockname()[1]
    return port


def test_no_answer_is_an_api_connection_error():
    port = free_port()
    with Client(f"http://127.0.0.1:{port}", SERVICE_KEY) as api, \
            pytest.raises(ApiConnectionError) as info:
        api.list_jobs()
    assert (info.value.status, info.value.code) == (0, "connection_failed")
    assert f"127.0.0.1:{port}/v1/functions/jobs" in info.value.message
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with Client(url, SERVICE_KEY, timeout=0.2) as api, \
                pytest.raises(ApiConnectionError) as info:
            api.enqueue_job("reindex", {})
    assert info.value.code == "timeout" and "may have taken effect" in info.value.message
    assert isinstance(info.value, ApiError)


async def test_no_answer_is_an_api_connection_error_for_the_async_client():
    async with AsyncClient(f"http://127.0.0.1:{free_port()}", SERVICE_KEY) as api:
        with pytest.raises(ApiConnectionError) as info:
            await api.list_dlq()
    assert info.value.code == "connection_failed"


def test_a_proxy_page_a_429_and_a_malformed_answer_are_api_errors():
    with answering(502, b"<html><h1>502 Bad Gateway</h1></html>",
                   {"Content-Type": "text/html"}) as url, Client(url, SERVICE_KEY) as api, \
            pytest.raises(ApiError) as info:
        api.list_jobs()
    assert (info.value.status, info.value.code) == (502, "http_error")
    assert "Bad Gateway" in info.value.message and info.value.retry_after is None
    refusal = b'{"data": null, "error": {"code": "too_many_requests", "message": "wait"}}'
    with answering(429, refusal, {"Content-Type": "application/json",
                                  "Retry-After": "37"}) as url, \
            Client(url, SERVICE_KEY) as api, pytest.raises(ApiError) as info:
        api.list_jobs()
    assert (info.value.status, info.value.code, info.value.retry_after) == (
        429, "too_many_requests", 37.0)
    for body in (b'{"data": {"requeued": 1.7}}', b'{"data": {"requeued": true}}',
                 b'{"data": {"requeued": 1e999}}', b'{"data": {}}', b"[" * 100_000):
        with answering(200, body, {"Content-Type": "application/json"}) as url, \
                Client(url, SERVICE_KEY) as api, pytest.raises(ApiError) as info:
            api.requeue_dlq()
        assert info.value.status == 200, body[:40]


@pytest.mark.parametrize("key", [SERVICE_KEY + "\n", " " + SERVICE_KEY, "", "clé-" + "k" * 40])
def test_a_key_no_header_can_carry_is_refused_when_the_client_is_made(key):
    with pytest.raises(ValueError, match="key: must be the API key alone"):
        Client("http://127.0.0.1:1", key)
    with pytest.raises(ValueError, match="key: must be the API key alone"):
        AsyncClient("http://127.0.0.1:1", key)


def both(url: str, call: str) -> list[ApiError]:
    """What the sync and the async client raise for `call` (a method without arguments)."""

    async def awaited() -> None:
        async with AsyncClient(url, SERVICE_KEY) as api:
            await getattr(api, call)()

    raised: list[ApiError] = []
    with Client(url, SERVICE_KEY) as api, pytest.raises(ApiError) as info:
        getattr(api, call)()
    raised.append(info.value)
    with pytest.raises(ApiError) as info:
        asyncio.run(awaited())
    raised.append(info.value)
    return raised


def test_a_redirect_is_not_followed_but_named():
    """A 308 to https:// read "308 http_error: " with nothing to say where it pointed."""
    target = "https://api.example/v1/functions/jobs"
    with answering(308, b"", {"Location": target}) as url:
        for err in both(url, "list_jobs"):
            assert (err.status, err.code) == (308, "http_error")
            assert f"redirected to {target}" in err.message and "give it that URL" in err.message


def test_an_empty_or_half_shaped_error_answer_still_says_something():
    with answering(503, b"", {"Retry-After": "5"}) as url:
        for err in both(url, "list_jobs"):
            assert (err.status, err.retry_after) == (503, 5.0)
            assert err.message == "Service Unavailable (empty body)"
    half = b'{"data": null, "error": {"code": null, "message": null, "field": 3}}'
    with answering(400, half, {"Content-Type": "application/json"}) as url:
        for err in both(url, "list_jobs"):  # was "400 None: None"
            assert (err.code, err.field) == ("error", None)
            assert err.message == half.decode()


def test_an_answer_that_does_not_decode_is_an_api_connection_error():
    """A body that its Content-Encoding says is gzip but is not raised httpx's own
    DecodingError, past every `except ApiError`."""
    with answering(200, b"not gzip", {"Content-Encoding": "gzip",
                                      "Content-Type": "application/json"}) as url:
        for err in both(url, "requeue_dlq"):
            assert isinstance(err, ApiConnectionError)
            assert (err.status, err.code) == (0, "unreadable_answer")
            assert "may have taken effect" in err.message


@pytest.mark.parametrize("url", ["localhost:8000", "127.0.0.1:8000", "ftp://api.example",
                                 "http://[::1", "", "http://"])
def test_a_url_the_client_cannot_send_to_is_refused_when_the_client_is_made(url):
    """"localhost:8000" failed only at the first request, as a connection error."""
    with pytest.raises(ValueError, match="url: must be an http:// or https:// URL"):
        Client(url, SERVICE_KEY)
    with pytest.raises(ValueError, match="url: must be an http:// or https:// URL"):
        AsyncClient(url, SERVICE_KEY)


@pytest.mark.parametrize(("call", "argument"), [
    (lambda api: api.enqueue_job("reindex", {"at": datetime.now(UTC)}), "payload"),
    (lambda api: api.enqueue_job("reindex", {"x": float("nan")}), "payload"),
    (lambda api: api.enqueue_job("reindex", {}, delay_secs=float("inf")), "delay_secs"),
    (lambda api: api.create_cron_job("c", "* * * * *", "reindex", {"ids": {1, 2}}), "payload"),
])
def test_a_value_json_cannot_carry_is_refused_naming_the_argument(call, argument):
    """httpx's encoder raised TypeError or ValueError ("Object of type datetime is not JSON
    serializable") naming no argument."""
    with Client(f"http://127.0.0.1:{free_port()}", SERVICE_KEY) as api, \
            pytest.raises(ValueError, match=f"^{argument}: must be JSON-serialisable"):
        call(api)


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), True, "5"])
def test_a_timeout_no_socket_can_take_is_refused_when_the_client_is_made(timeout):
    """0 failed every request as connection_failed, which a retry loop retries for ever."""
    for make in (Client, AsyncClient):
        with pytest.raises(ValueError, match="timeout: must be a number of seconds above 0"):
            make("http://127.0.0.1:1", SERVICE_KEY, timeout=timeout)


def test_no_timeout_and_a_whole_number_of_seconds_are_taken():
    with answering(200, b'{"data": []}', {"Content-Type": "application/json"}) as url:
        for timeout in (None, 5, 0.5):
            with Client(url, SERVICE_KEY, timeout=timeout) as api:
                assert api.list_jobs() == []


@pytest.mark.parametrize(("call", "argument"), [
    (lambda api: api.get_job("dlq"), "job_id"),  # was the DLQ's list: "expected an object"
    (lambda api: api.get_job(""), "job_id"),  # was a 307 to the job list, "give that URL"
    (lambda api: api.cancel_job("."), "job_id"),  # was the bulk cancel: "body: Field required"
    (lambda api: api.retry_job("dlq"), "job_id"),
    (lambda api: api.discard_job(".."), "job_id"),
    (lambda api: api.get_outbox_event(""), "event_id"),
    (lambda api: api.get_webhook(""), "endpoint_id"),
    (lambda api: api.disable_webhook("."), "endpoint_id"),
    (lambda api: api.enable_webhook(".."), "endpoint_id"),
    (lambda api: api.delete_webhook(""), "endpoint_id"),
    (lambda api: api.list_webhook_attempts("."), "endpoint_id"),
    (lambda api: api.delete_cron_job(""), "name"),  # was a 307 to the cron list
    (lambda api: api.delete_cron_job("."), "name"),
])
def test_an_id_that_would_send_the_request_elsewhere_is_refused_naming_it(api_url, clean_db,
                                                                         call, argument):
    """An id is a path segment: `dlq`, `.`, `..` or an empty one made the request another
    route's (the DLQ list, the bulk cancel, a redirect), answered with words about that.
    Another id not a UUID still goes to the API, which answers 400 naming `id`."""
    with Client(api_url, SERVICE_KEY) as api, pytest.raises(ValueError, match=f"^{argument}: "):
        call(api)

    async def main() -> None:
        async with AsyncClient(api_url, SERVICE_KEY) as api:
            with pytest.raises(ValueError, match=f"^{argument}: "):
                await call(api)

    asyncio.run(main())


def test_an_id_given_as_text_in_another_spelling_is_sent_as_the_uuid(client, engine, tenant):
    with engine.begin() as conn:
        job = insert_job(conn, tenant_id=tenant)
    for spelling in (str(job).upper(), job.hex, f"{{{job}}}", f"urn:uuid:{job}"):
        assert client.get_job(spelling)["id"] == str(job)
