"""postrelay.client against the served API: the sync Client and the AsyncClient."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from postrelay.client import ApiError, AsyncClient, Client
from tests.api.conftest import SERVICE_KEY, tenant_key
from tests.factories import insert_job


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
