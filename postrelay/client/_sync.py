"""The synchronous client."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any, TypeVar
from uuid import UUID

import httpx

from postrelay.client import _calls as c
from postrelay.client._calls import CronEntry, Job

T = TypeVar("T")


class Client:
    """Talks to the API at `url` with `key` (service-role or tenant key), waiting at most
    `timeout` seconds for each step of a request (None: no limit). ValueError at once for a
    url that is not http(s) (`localhost:8000`), a timeout that is not above 0, or a key no
    header can carry (a line break left from the file it was read from)."""

    def __init__(self, url: str, key: str, *, timeout: float | None = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self._http = httpx.Client(base_url=c.base_url(url), headers=c.headers(key),
                                  timeout=c.timeout_secs(timeout), transport=transport)

    def _send(self, call: c.Call[T]) -> T:
        try:
            response = self._http.request(call.method, call.path, params=call.params or None,
                                          json=call.json)
        except (httpx.TransportError, httpx.DecodingError) as exc:
            raise c.unanswered(call, self._http.base_url, exc) from exc
        return c.result(call, response)

    def enqueue_job(self, kind: str, payload: Mapping[str, Any], *,
                    delay_secs: float | None = None, max_attempts: int | None = None,
                    priority: int | None = None, idempotency_key: str | None = None,
                    tenant_id: UUID | str | None = None) -> Job:
        """Enqueue a job; returns it. A used idempotency key returns the first job."""
        return self._send(c.enqueue_job(
            kind, payload, delay_secs=delay_secs, max_attempts=max_attempts, priority=priority,
            idempotency_key=idempotency_key, tenant_id=tenant_id))

    def get_job(self, job_id: UUID | str) -> Job:
        """One job; ApiError 404 if missing (or another tenant's)."""
        return self._send(c.get_job(job_id))

    def list_jobs(self, status: str | None = None, limit: int = 50) -> list[Job]:
        """Jobs, newest first; `limit` 1-500."""
        return self._send(c.list_jobs(status, limit))

    def list_dlq(self, limit: int = 50) -> list[Job]:
        """Dead jobs, the most recently dead-lettered first."""
        return self._send(c.list_dlq(limit))

    def retry_job(self, job_id: UUID | str) -> Job:
        """Give a dead job one more attempt (attempts kept); returns it."""
        return self._send(c.retry_job(job_id))

    def requeue_dlq(self, limit: int | None = None) -> int:
        """Requeue dead jobs (at most 1000 per call); returns how many."""
        return self._send(c.requeue_dlq(limit))

    def discard_job(self, job_id: UUID | str) -> None:
        """Delete one dead job."""
        self._send(c.discard_job(job_id))

    def create_cron_job(self, name: str, schedule: str, kind: str,
                        payload: Mapping[str, Any] | None = None,
                        tenant_id: UUID | str | None = None, *, priority: int | None = None,
                        max_attempts: int | None = None) -> CronEntry:
        """Create a cron entry; returns it (schedule as stored, 6 fields)."""
        return self._send(c.create_cron_job(
            name, schedule, kind, payload, tenant_id, priority, max_attempts))

    def list_cron_jobs(self) -> list[CronEntry]:
        """Every cron entry the key may see."""
        return self._send(c.list_cron_jobs())

    def delete_cron_job(self, name: str, tenant_id: UUID | str | None = None) -> None:
        """Delete a cron entry by name (the service-role key: `tenant_id` picks the tenant
        when several have the name); ApiError 404 if unknown."""
        self._send(c.delete_cron_job(name, tenant_id))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
