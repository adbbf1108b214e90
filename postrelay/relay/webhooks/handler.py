"""The `outbox_dispatch` handler: deliver one event to one endpoint, Standard Webhooks style.

    registry = webhook_registry(engine, allow_private=settings.webhook_allow_private)
    worker = Worker(engine, config, registry=builtin.merged(registry), ...)

One attempt: read the event and the endpoint (a removed or disabled endpoint stops the job
unsent; the read is started for the whole claim when the job is claimed: `claimed`), check
the target address, POST the event's JSON with `webhook-id` (the same on every retry, so
receivers can deduplicate), a fresh `webhook-timestamp` and a `webhook-signature` over
exactly the bytes sent, record the attempt in aa_webhook_attempt (written with the job's
outcome, in its transaction), and turn the answer into the job's outcome (see `responses`).
Redirects are not followed.
HTTPS is verified against the default bundle, or against the endpoint's private CA alone
when it has one (`trust`); the host name is always checked. Deliveries to one target (the
same checked address, host name and TLS trust) reuse its open connections (`pool`); the
registry's closer closes them when the worker stops.

Delivery is at least once: a crash after the POST and before the job is marked done sends
again (with the same webhook-id). A job re-run after an attempt was recorded as 2xx does
not send again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import httpx
from sqlalchemy import TextClause
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core import jsontext
from postrelay.core.errors import PostrelayError
from postrelay.core.telemetry import event as log_event
from postrelay.queue import (
    Job,
    PermanentError,
    Registry,
    RetryAfter,
    RowWriter,
    StopJob,
    ThrottlePolicy,
    record_with_outcome,
    throttle_refused,
)
from postrelay.relay.webhooks import signing
from postrelay.relay.webhooks.claimed import ClaimedDeliveries
from postrelay.relay.webhooks.endpoints import WEBHOOK_SQL
from postrelay.relay.webhooks.netguard import AddressRefused, Target, resolve
from postrelay.relay.webhooks.pool import DeliveryClients, TargetKey
from postrelay.relay.webhooks.responses import RETRY_AFTER_CAP_SECS, THROTTLE_STATUSES, verdict
from postrelay.relay.webhooks.route import CHANNEL, DISPATCH_KIND
from postrelay.relay.webhooks.trust import BadEndpointCa, CaContexts

DEFAULT_TIMEOUT_SECS = 10.0
ENDPOINT_KEY = "endpoint_id"  # the payload field that names a delivery's endpoint
BODY_LIMIT = 2048  # bytes of the response body kept in aa_webhook_attempt
ERROR_LIMIT = 2048
USER_AGENT = "postrelay-webhooks/1"


class WebhookDeliveryError(PostrelayError):
    """A failed attempt that may succeed later (5xx, network error, timeout): retried."""


class BadEndpointUrl(PermanentError):
    """The endpoint's URL cannot be turned into a request (stored before `webhooks add`
    normalised URLs, or edited in the database): not retried, nothing was sent."""


def webhook_registry(
    engine: AsyncEngine,
    *,
    allow_private: bool = False,
    timeout_secs: float = DEFAULT_TIMEOUT_SECS,
    clock: Callable[[], float] = time.time,
    retry_after_cap_secs: float = RETRY_AFTER_CAP_SECS,
    throttle: ThrottlePolicy | None = None,
) -> Registry:
    """A Registry with the `outbox_dispatch` handler, to merge into the worker's."""
    registry = Registry()
    claimed = ClaimedDeliveries(engine, _parse_payload)
    clients = DeliveryClients()
    fn = webhook_handler(engine, allow_private=allow_private, timeout_secs=timeout_secs,
                         clock=clock, retry_after_cap_secs=retry_after_cap_secs,
                         throttle=throttle, claimed=claimed, clients=clients)
    # The request has its own deadline; the rest is two short database round trips.
    registry.register(DISPATCH_KIND, fn, timeout=timeout_secs + 30.0,
                      on_claim=claimed.claimed)
    registry.closers.extend((claimed.close, clients.close))
    return registry


def webhook_handler(
    engine: AsyncEngine,
    *,
    allow_private: bool = False,
    timeout_secs: float = DEFAULT_TIMEOUT_SECS,
    clock: Callable[[], float] = time.time,
    retry_after_cap_secs: float = RETRY_AFTER_CAP_SECS,
    throttle: ThrottlePolicy | None = None,
    claimed: ClaimedDeliveries | None = None,
    clients: DeliveryClients | None = None,
) -> Callable[[Job], Any]:
    """The handler coroutine. `allow_private` comes from POSTRELAY_WEBHOOK_ALLOW_PRIVATE,
    and holds for an operator's endpoints only (`private_allowed`; not a tenant key's);
    `clock` gives the unix time for webhook-timestamp (tests pass their own). A 429 or 503
    throttles the endpoint's deliveries for every worker by `throttle` (default:
    ThrottlePolicy()); the delivery itself is retried as any other. With `claimed` (whose
    `claimed` is the kind's claim hook), a run takes its row from the read started at its
    claim when that is fresh; without, every run reads its own. With `clients`, deliveries
    to one target reuse its open connections, and the caller closes `clients` once the
    handler is done with it; without, each delivery's connection is closed after its answer."""
    # NaN passed `<= 0` and broke every delivery's deadline; a negative cap turned every
    # Retry-After into a negative wait, so a receiver asking for time was hammered.
    if not _finite(timeout_secs) or not timeout_secs > 0:
        raise ValueError(f"timeout_secs: must be a number of seconds, more than 0 and "
                         f"finite, got {timeout_secs!r}")
    if not _finite(retry_after_cap_secs) or not retry_after_cap_secs >= 0:
        raise ValueError(f"retry_after_cap_secs: must be a number of seconds, 0 or more "
                         f"and finite, got {retry_after_cap_secs!r}")
    policy = throttle or ThrottlePolicy()
    contexts = CaContexts()  # built once per CA (and the default bundle), not per delivery
    if clients is None:
        clients = DeliveryClients(idle_per_target=0)  # nothing would close what it kept

    async def outbox_dispatch(job: Job) -> None:
        event_id, endpoint_id = _parse_payload(job)
        row = None if claimed is None else await claimed.take(job)
        if row is None:  # no fresh read from the claim: this run's own
            row = await _delivery_load(engine, event_id, endpoint_id)
        _check_deliverable(job, row, event_id, endpoint_id)
        if row["delivered"]:  # a re-run after a recorded success (e.g. a rescued job)
            log_event("postrelay.webhook.already_delivered", job_id=str(job.id),
                      event_id=str(event_id), endpoint_id=str(endpoint_id))
            return
        body = message_body(row["event_type"], row["payload"], row["event_created_at"])
        msg_id = f"msg_{event_id}"
        attempt = _Attempt(engine, job, event_id, endpoint_id)
        try:
            verify = (contexts.default() if row["ca_pem"] is None
                      else contexts.get(row["ca_pem"]))
            status, headers, text = await _post(clients, row["url"], row["secret"], msg_id,
                                                body, int(clock()),
                                                allow_private and row["private_allowed"],
                                                timeout_secs, verify)
        except (AddressRefused, BadEndpointUrl, BadEndpointCa) as exc:
            await attempt.record(error=str(exc))
            raise
        except (httpx.HTTPError, OSError, TimeoutError) as exc:
            error = _describe(exc, timeout_secs)
            await attempt.record(error=error)
            raise WebhookDeliveryError(f"POST {row['url']}: {error}") from exc
        now = datetime.fromtimestamp(clock(), UTC)
        answer = verdict(status, headers.get("retry-after"), now,
                         cap_secs=retry_after_cap_secs)
        excerpt = f"HTTP {status} from {row['url']}: {text[:200]!r}"
        if answer.action == "gone":
            reason = f"410 Gone at {now.isoformat(timespec='seconds')}"
            await attempt.record(status=status, body=text, disable_reason=reason)
            log_event("postrelay.webhook.endpoint_disabled", logging.WARNING,
                      endpoint_id=str(endpoint_id), reason=reason)
            # Not `done` (nothing was delivered) and not the DLQ (a replay would go to an
            # endpoint that is gone): stopped as `failed`, visible with its reason.
            raise StopJob(f"{excerpt}; endpoint {endpoint_id} disabled")
        await attempt.record(status=status, body=text)
        if answer.action == "delivered":
            return
        if status in THROTTLE_STATUSES:
            wait = "" if answer.delay_secs is None else f", Retry-After {answer.delay_secs:g} s"
            # The key as the claim reads it from the payload (sql/limited.sql, job_claim_limited).
            await throttle_refused(
                engine, policy, kind=DISPATCH_KIND, key_path=[ENDPOINT_KEY],
                key=str(job.payload[ENDPOINT_KEY]), tenant_id=job.tenant_id,
                pause_secs=answer.delay_secs, reason=f"HTTP {status}{wait}",
                actor=f"webhook endpoint {endpoint_id}")
        if answer.action == "permanent":
            raise PermanentError(excerpt)
        if answer.delay_secs is not None:
            raise RetryAfter(answer.delay_secs, f"{excerpt}; Retry-After {answer.delay_secs:g} s")
        raise WebhookDeliveryError(excerpt)

    return outbox_dispatch


def message_body(event_type: str, payload: Mapping[str, Any], created_at: datetime) -> bytes:
    """The JSON sent: Standard Webhooks' recommended envelope. Deterministic for one event,
    so every retry sends the same bytes."""
    envelope = {
        "type": event_type,
        "timestamp": created_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "data": payload,
    }
    return json.dumps(envelope, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


async def _post(
    clients: DeliveryClients, url: str, secret: str, msg_id: str, body: bytes,
    timestamp: int, allow_private: bool, timeout_secs: float, verify: ssl.SSLContext,
) -> tuple[int, httpx.Headers, str]:
    """POST once; returns status, headers and the first BODY_LIMIT bytes of the body.

    One deadline covers resolving, connecting and receiving the headers; the body is read
    within what is left of it, and a body cut short still leaves the status. The body is
    only kept for the attempts log: it is asked for uncompressed and kept as it arrived.
    The connection is kept for the target's next delivery only if the whole body was read
    (httpcore closes one whose answer was left unread).
    """
    original = _parsed_url(url)
    port = original.port or (443 if original.scheme == "https" else 80)
    deadline = asyncio.get_running_loop().time() + timeout_secs
    async with AsyncExitStack() as held:  # the clients used, released after the response
        async with asyncio.timeout_at(deadline):
            # The ASCII (IDNA) host, as httpx sends it: the resolver would encode a Unicode
            # name again by other rules and could look up another name.
            target = await resolve(original.raw_host.decode("ascii"), port,
                                   allow_private=allow_private)
            headers = {**signing.headers(secret, msg_id, timestamp, body),
                       "host": original.netloc.decode("ascii"), "user-agent": USER_AGENT,
                       "accept-encoding": "identity"}
            response = await _send_to_first_reachable(held, clients, original, port, target,
                                                      verify, timeout_secs, headers, body)
        try:
            received = bytearray()
            async with asyncio.timeout_at(deadline):
                # As it arrived, never inflated: a compressed answer (sent although we ask
                # for none) could inflate a thousandfold to give the first BODY_LIMIT bytes.
                async for chunk in response.aiter_raw():
                    received += chunk
                    if len(received) >= BODY_LIMIT:
                        break
        except (httpx.HTTPError, TimeoutError):
            pass  # the status is what matters; keep what arrived
        finally:
            await response.aclose()
    return response.status_code, response.headers, _text(bytes(received[:BODY_LIMIT]))


def _parsed_url(url: str) -> httpx.URL:
    """The endpoint URL as httpx reads it; BadEndpointUrl for one it cannot use."""
    try:
        parsed = httpx.URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.raw_host:
            raise httpx.InvalidURL("not an absolute http:// or https:// URL")
        if parsed.port is not None and not 1 <= parsed.port <= 65535:
            raise httpx.InvalidURL(f"port {parsed.port} is out of range")
        parsed.raw_host.decode("ascii")
        parsed.netloc.decode("ascii")
    except (httpx.InvalidURL, ValueError, UnicodeError) as exc:
        raise BadEndpointUrl(f"the endpoint URL {url!r} cannot be requested ({exc}); "
                             "fix it with `postrelay webhooks rm` and `webhooks add`, which "
                             "checks URLs") from None
    return parsed


async def _send_to_first_reachable(
    held: AsyncExitStack, clients: DeliveryClients, url: httpx.URL, port: int,
    target: Target, verify: ssl.SSLContext, timeout_secs: float, headers: dict[str, str],
    body: bytes,
) -> httpx.Response:
    """Send to the checked addresses in order until one accepts the connection (a name
    such as `localhost` may resolve to ::1 first while the server listens on 127.0.0.1).
    The URL's host name stays in the Host header and in TLS (SNI, certificate check).
    A refused certificate ends the attempt there: the receiver's identity failed, not the
    route to it, and another address of the name must not get to answer in its place.
    Each address has its own client (`clients`), held until `held` closes: a connection
    reused is one to the address just checked."""
    extensions = {"sni_hostname": url.host} if url.scheme == "https" else {}
    failure: httpx.ConnectError | None = None
    for address in target.addresses:
        key = TargetKey(url.scheme, url.host, port, address, verify)
        client = await held.enter_async_context(clients.client(key))
        try:
            request = client.build_request("POST", url.copy_with(host=str(address)),
                                           content=body, headers=headers,
                                           extensions=extensions, timeout=timeout_secs)
        except (httpx.InvalidURL, ValueError, UnicodeError) as exc:
            raise BadEndpointUrl(f"no request can be built for {url} ({exc})") from None
        try:
            return await client.send(request, stream=True)
        # A connect error comes from opening a new connection (httpcore replaces a pooled
        # one found closed before sending on it): nothing was sent, the next address is safe.
        except httpx.ConnectError as exc:
            if _certificate_refused(exc):
                raise
            failure = exc
    assert failure is not None  # resolve() never returns an empty target
    raise failure


def _certificate_refused(exc: BaseException) -> bool:
    """Whether `exc` is the certificate check's refusal: the ssl error is on the chain of
    exceptions under httpx's ConnectError (httpcore's pool re-raises its own ConnectError
    `from None`, which leaves the ssl error as its context, not its cause)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _attempt_rows(rows: Sequence[dict[str, Any]]) -> tuple[TextClause, Any]:
    return WEBHOOK_SQL["webhook_attempt_insert_many"], {"rows": jsontext.encode_rows(rows)}


# The attempts' rows, written by the completer in their outcomes' transaction, many in one
# statement: a transaction of their own cost each delivery a connection and two more round
# trips, and one committed before the outcome said no more than the outcome.
ATTEMPT_ROWS = RowWriter("webhook_attempt", _attempt_rows)


class _Attempt:
    """Records the attempt's aa_webhook_attempt row, timing from its creation."""

    def __init__(self, engine: AsyncEngine, job: Job, event_id: UUID, endpoint_id: UUID) -> None:
        self.engine = engine
        self.job = job
        self.event_id = event_id
        self.endpoint_id = endpoint_id
        self.started = time.perf_counter()

    async def record(self, *, status: int | None = None, body: str | None = None,
                     error: str | None = None, disable_reason: str | None = None) -> None:
        duration_ms = round((time.perf_counter() - self.started) * 1000)
        row = {"job_id": self.job.id, "endpoint_id": self.endpoint_id,
               "event_id": self.event_id, "attempt": self.job.attempts, "status_code": status,
               "duration_ms": duration_ms, "response_body": body,
               "error": None if error is None else _text(error.encode()[:ERROR_LIMIT])}
        if disable_reason is None:
            record_with_outcome(ATTEMPT_ROWS, row)
        else:  # the endpoint stops for every worker now, not once this job is finished
            async with self.engine.begin() as conn:
                await conn.execute(WEBHOOK_SQL["webhook_attempt_insert"], row)
                await conn.execute(WEBHOOK_SQL["webhook_endpoint_disable_gone"],
                                   {"id": self.endpoint_id, "reason": disable_reason})
        delivered = status is not None and 200 <= status <= 299
        log_event("postrelay.webhook.attempt", logging.DEBUG if delivered else logging.INFO,
                  job_id=str(self.job.id), event_id=str(self.event_id),
                  endpoint_id=str(self.endpoint_id), attempt=self.job.attempts, status=status,
                  duration_ms=duration_ms, error=error)


def _parse_payload(job: Job) -> tuple[UUID, UUID]:
    payload = job.payload
    if payload.get("channel", CHANNEL) != CHANNEL:
        raise PermanentError(f"outbox_dispatch channel {payload.get('channel')!r} is not "
                             f"{CHANNEL!r}; no handler for it in this worker")
    try:
        return UUID(str(payload["event_id"])), UUID(str(payload["endpoint_id"]))
    except (KeyError, ValueError) as exc:
        raise PermanentError(f"payload needs event_id and endpoint_id UUIDs: {exc!r}") from None


async def _delivery_load(engine: AsyncEngine, event_id: UUID,
                         endpoint_id: UUID) -> Mapping[Any, Any]:
    async with engine.connect() as conn:
        return (await conn.execute(WEBHOOK_SQL["webhook_delivery_load"], {
            "event_id": event_id, "endpoint_id": endpoint_id})).mappings().one()


def _check_deliverable(job: Job, row: Mapping[Any, Any], event_id: UUID,
                       endpoint_id: UUID) -> None:
    if row["endpoint_id"] is None:
        raise StopJob(f"webhook endpoint {endpoint_id} was removed; not sent")
    if not row["enabled"]:
        raise StopJob(f"webhook endpoint {endpoint_id} is disabled; not sent")
    if row["event_id"] is None:
        raise PermanentError(f"outbox event {event_id} no longer exists (retention?)")
    if not row["event_tenant_id"] == row["endpoint_tenant_id"] == job.tenant_id:
        raise PermanentError("the event, the endpoint and the job belong to different tenants")


def _finite(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _describe(exc: BaseException, timeout_secs: float) -> str:
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return f"timed out after {timeout_secs:g} s"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _text(data: bytes) -> str:
    # A body cut at BODY_LIMIT may end inside a character; PostgreSQL text cannot hold NUL.
    return data.decode("utf-8", errors="ignore").replace("\x00", "")
