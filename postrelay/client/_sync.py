"""The synchronous client."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, Self, TypeVar
from uuid import UUID

import httpx

from postrelay.client import _calls as c
from postrelay.client import _webhooks as w
from postrelay.client._calls import (
    CancelledJob,
    CronEntry,
    Job,
    Limit,
    OutboxEvent,
    OutboxStatus,
    Pause,
    Throttle,
)
from postrelay.client._webhooks import AddedWebhook, Webhook, WebhookAttempt

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
        """Jobs, newest first: `status` pending, running, done, failed or dlq (None: any);
        `limit` 1-500."""
        return self._send(c.list_jobs(status, limit))

    def list_dlq(self, limit: int = 50) -> list[Job]:
        """Dead jobs, the most recently dead-lettered first; `limit` 1-500."""
        return self._send(c.list_dlq(limit))

    def retry_job(self, job_id: UUID | str) -> Job:
        """Give a dead job one more attempt (attempts kept); returns it. ApiError 404 if it
        is not in the DLQ (or another tenant's)."""
        return self._send(c.retry_job(job_id))

    def requeue_dlq(self, limit: int | None = None) -> int:
        """Requeue up to `limit` (1-1000, default 1000) dead jobs, the oldest deaths first,
        attempts kept; returns how many. Call again while the count equals the limit."""
        return self._send(c.requeue_dlq(limit))

    def discard_job(self, job_id: UUID | str) -> None:
        """Delete one dead job; ApiError 404 if it is not in the DLQ (or another
        tenant's)."""
        self._send(c.discard_job(job_id))

    def create_cron_job(self, name: str, schedule: str, kind: str,
                        payload: Mapping[str, Any] | None = None,
                        tenant_id: UUID | str | None = None, *, priority: int | None = None,
                        max_attempts: int | None = None) -> CronEntry:
        """Create a cron entry; returns it (schedule as stored, 6 fields). ApiError 409 if
        the tenant has an entry of that name."""
        return self._send(c.create_cron_job(
            name, schedule, kind, payload, tenant_id, priority, max_attempts))

    def list_cron_jobs(self) -> list[CronEntry]:
        """Every cron entry the key may see."""
        return self._send(c.list_cron_jobs())

    def delete_cron_job(self, name: str, tenant_id: UUID | str | None = None) -> None:
        """Delete a cron entry by name (the service-role key: `tenant_id` picks the tenant
        when several have the name); ApiError 404 if unknown."""
        self._send(c.delete_cron_job(name, tenant_id))

    def cancel_job(self, job_id: UUID | str) -> CancelledJob:
        """Cancel a pending, scheduled or running job: it becomes `failed`, and a running
        one's handler is cancelled within a second. Returns its `id` and what it `was`;
        ApiError 409 if it already finished, 404 if missing (or another tenant's)."""
        return self._send(c.cancel_job(job_id))

    def cancel_jobs(self, *, kind: str | None = None, tenant_id: UUID | str | None = None,
                    created_from: datetime | str | None = None,
                    created_to: datetime | str | None = None,
                    event_id: UUID | str | None = None, template: str | None = None,
                    limit: int | None = None) -> int:
        """Cancel up to `limit` (1-1000, default 1000) pending or running jobs matching every
        filter given, oldest first; returns how many. At least one filter (else ApiError
        400); `created_from`/`created_to` bound the creation time, `event_id` picks the jobs
        of an outbox event, `template` the email_send jobs of a template. A tenant key
        cancels its own tenant's jobs only. Call again while the count equals the limit."""
        return self._send(c.cancel_jobs(
            kind=kind, tenant_id=tenant_id, created_from=created_from, created_to=created_to,
            event_id=event_id, template=template, limit=limit))

    def list_pauses(self) -> list[Pause]:
        """What is paused, oldest first (a tenant key: its own pauses and the
        installation-wide ones), with `pausedBy` and `pausedAt`."""
        return self._send(c.list_pauses())

    def pause(self, kind: str | None = None, tenant_id: UUID | str | None = None, *,
              everything: bool = False) -> Pause:
        """Stop workers claiming the jobs of a kind, a tenant, a kind within a tenant, or
        every job (`everything`, service role); running jobs finish. Returns the pause: the
        one made before, with who made it and since when, if it was paused already."""
        return self._send(c.pause(kind, tenant_id, everything))

    def resume(self, kind: str | None = None, tenant_id: UUID | str | None = None, *,
               everything: bool = False) -> Pause:
        """Lift the pause of exactly this scope; returns the pause lifted. ApiError 404 if it
        is not paused, 403 `operator_pause` for a tenant key and a pause the operator made."""
        return self._send(c.resume(kind, tenant_id, everything))

    def list_limits(self) -> list[Limit]:
        """Every rate and concurrency limit (a tenant key: its own and the kind-wide ones)."""
        return self._send(c.list_limits())

    def list_throttles(self) -> list[Throttle]:
        """The destinations throttled now after refusing work (SMTP 421/454, HTTP 429/503),
        as the limits' answer lists them (a tenant key: its own and the shared SMTP server)."""
        return self._send(c.list_throttles())

    def set_limit(self, kind: str, *, rate: str | float | None = None, burst: int | None = None,
                  concurrency: int | None = None, key: str | None = None,
                  tenant_id: UUID | str | None = None) -> Limit:
        """Set (or replace) the limit of a kind, optionally within a tenant: a `rate` (`14/s`,
        `1000/min`, or a number per second) with a `burst` and/or a `concurrency` cap,
        optionally per value of the payload field `key`; returns it. ApiError 403
        (`operator_limit`, `kind_wide_limit`) for a tenant key and the operator's limits."""
        return self._send(c.set_limit(kind, rate=rate, burst=burst, concurrency=concurrency,
                                      key=key, tenant_id=tenant_id))

    def remove_limit(self, kind: str, tenant_id: UUID | str | None = None) -> Limit:
        """Remove the limit of exactly this kind (and tenant); returns it. ApiError 404 if
        there is none, 403 `operator_limit` for a tenant key and a limit the operator set."""
        return self._send(c.remove_limit(kind, tenant_id))

    def get_outbox_status(self) -> OutboxStatus:
        """The relay's backlog, lag (`lag_secs`), handled, retrying and dead counts, and the
        20 most recent dead events (a tenant key: its tenant's events only)."""
        return self._send(c.get_outbox_status())

    def get_outbox_event(self, event_id: UUID | str) -> OutboxEvent:
        """One outbox event, its relay state and every job it produced; ApiError 404 if
        missing (or another tenant's)."""
        return self._send(c.get_outbox_event(event_id))

    def replay_outbox(self, event_id: UUID | str | None = None, *,
                      since: datetime | str | None = None,
                      until: datetime | str | None = None,
                      dead: bool = False) -> int:
        """Hand one event, or every event created in [`since`, `until`), back to the relay;
        returns how many. `dead=True`: only the events the relay gave up on (alone: all of
        them). Jobs that still exist are not made again. ApiError 404 for an unknown
        `event_id` (or another tenant's); a time without a zone is UTC."""
        return self._send(c.replay_outbox(event_id, since, until, dead))

    def list_webhooks(self, tenant_id: UUID | str | None = None) -> list[Webhook]:
        """Every webhook endpoint the key may see (a tenant key: its tenant's; the
        service-role key: `tenant_id`'s if given), oldest first. Never a secret or a CA's
        certificates: `private_ca` says whether an endpoint has one."""
        return self._send(w.list_webhooks(tenant_id))

    def get_webhook(self, endpoint_id: UUID | str) -> Webhook:
        """One webhook endpoint; ApiError 404 if missing (or another tenant's)."""
        return self._send(w.get_webhook(endpoint_id))

    def add_webhook(self, url: str, *, event_types: Iterable[str] | None = None,
                    ca_pem: str | None = None,
                    tenant_id: UUID | str | None = None) -> AddedWebhook:
        """Add an enabled endpoint; returns `{"endpoint": ..., "secret": "whsec_..."}`, the
        signing secret shown this once only. `event_types`: exact types or globs
        (`order.*`), None for every type; `ca_pem`: a private CA (PEM) an https:// URL's
        deliveries trust instead of the default CAs; `tenant_id`: required for the
        service-role key. ApiError 400 naming `url`, `eventTypes` or `caPem` for bad input
        (nothing is added)."""
        return self._send(w.add_webhook(url, event_types, ca_pem, tenant_id))

    def disable_webhook(self, endpoint_id: UUID | str) -> Webhook:
        """Stop delivering to an endpoint (its queued deliveries stop unsent); returns it,
        `disabled_by` saying who disabled it (`operator` for the service-role key, `tenant`
        for a tenant key). A tenant key's disable of one the operator disabled returns it
        unchanged. ApiError 404 if missing (or another tenant's)."""
        return self._send(w.disable_webhook(endpoint_id))

    def enable_webhook(self, endpoint_id: UUID | str) -> Webhook:
        """Deliver to an endpoint again, events from now on (`replay_outbox` sends what it
        missed); returns it. ApiError 403 `disabled_by_operator` for a tenant key when the
        operator disabled it (only the service-role key or the CLI enables it then); 404 if
        missing (or another tenant's)."""
        return self._send(w.enable_webhook(endpoint_id))

    def delete_webhook(self, endpoint_id: UUID | str) -> None:
        """Delete an endpoint and its delivery log; ApiError 404 if missing (or another
        tenant's)."""
        self._send(w.delete_webhook(endpoint_id))

    def list_webhook_attempts(self, endpoint_id: UUID | str,
                              limit: int = 50) -> list[WebhookAttempt]:
        """An endpoint's delivery attempts, newest first; `limit` 1-500. ApiError 404 if the
        endpoint is missing (or another tenant's)."""
        return self._send(w.list_webhook_attempts(endpoint_id, limit))

    def close(self) -> None:
        """Close the client's connections (leaving its `with` or `async with` block does it)."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
