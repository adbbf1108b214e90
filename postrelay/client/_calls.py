"""What each client method sends, and how an answer becomes a value or an ApiError.

Shared by the sync and async clients, so the two can only differ in how they wait.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote
from uuid import UUID

import httpx

from postrelay.core.errors import PostrelayError

JOBS = "/v1/functions/jobs"
CRON = "/v1/functions/cron"
PAUSES = "/v1/functions/pauses"
LIMITS = "/v1/functions/limits"
OUTBOX = "/v1/functions/outbox"

T = TypeVar("T")
# What the API returns, as JSON objects with its field names: snake_case for jobs, cron
# entries and the outbox (`tenant_id`), camelCase for pauses, limits and throttles
# (`tenantId`), as the API's answers spell them.
Job = dict[str, Any]
CronEntry = dict[str, Any]
CancelledJob = dict[str, Any]  # id, and `was`: the status it had (pending, running)
Pause = dict[str, Any]
Limit = dict[str, Any]
Throttle = dict[str, Any]  # a destination throttled now, after it refused work
OutboxStatus = dict[str, Any]
OutboxEvent = dict[str, Any]


class ApiError(PostrelayError):
    """The API answered with an error: `status` (HTTP), `code` and `message` as it sent them;
    `retry_after`: the seconds its Retry-After header asks to wait (a 429), else None."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(f"{status} {code}: {message}" if status else f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.retry_after = retry_after


class ApiConnectionError(ApiError):
    """No answer came, so `status` is 0: the connection failed (`code` connection_failed),
    the answer did not come in time (`code` timeout), or it came but could not be read
    (`code` unreadable_answer: its body did not decode as its Content-Encoding said)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(0, code, message)


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request, and `pick`: the value of the part of the answer it `reads` (its `data`,
    or its `meta`), or ValueError when that is not of the shape the call expects."""

    method: str
    path: str
    pick: Callable[[Any], T]
    params: dict[str, Any] = field(default_factory=dict)
    json: dict[str, Any] | None = None
    reads: Literal["data", "meta"] = "data"


def _object(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    return data


def _objects(data: Any) -> list[dict[str, Any]]:
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise ValueError("expected a list of JSON objects")
    return data


def _nothing(data: Any) -> None:
    return None


def _count(name: str) -> Callable[[Any], int]:
    """The pick of an answer `{name: N}`: N, a whole number."""

    def pick(data: Any) -> int:
        count = _object(data)[name]
        if isinstance(count, bool) or not isinstance(count, int):  # int() would round 1.7
            raise ValueError(f"{name}: expected a whole number, got {count!r}")
        return count

    return pick


def _throttles(meta: Any) -> list[Throttle]:
    return _objects(_object(meta)["throttled"])


def _id(value: UUID | str, argument: str, routes: tuple[str, ...] = ()) -> str:
    """An id as its URL's path segment. ValueError naming the argument, before anything is
    sent, for one that would make the request another route's: an empty segment, `.` or
    `..` (which the URL resolves away), or a sibling route's name (`routes`). Any other
    text goes as it is, for the API to answer (400 naming `id` for one not a UUID)."""
    # Sent as they were, `get_job("dlq")` read the DLQ's list ("expected a JSON object"),
    # `cancel_job(".")` reached the bulk cancel ("body: Field required"), and an empty id
    # a redirect to the list ("give it that URL instead"): answers about another route.
    text = str(value)
    if text.strip(".") == "" or text in routes:
        raise ValueError(f"{argument}: must be an id, such as "
                         f"3f2b1a9c-0d4e-4f5a-8b6c-7d8e9f0a1b2c; got {text!r}")
    return quote(text, safe="")


# The literal segments beside `/jobs/{id}`: an id spelled so names another route.
_JOB_ROUTES = ("dlq", "cancel")


def _name(value: str) -> str:
    """A cron entry's name as its URL's path segment (ValueError as `_id`)."""
    if value.strip(".") == "":
        raise ValueError(f"name: must be a cron entry's name, such as nightly; got {value!r}")
    return quote(value, safe="")


def _uuid(value: UUID | str | None) -> str | None:
    return str(value) if value is not None else None


def _time(value: datetime | str | None) -> str | None:
    """A time as the API reads it: ISO 8601 text (one without a zone is sent as it is)."""
    return value.isoformat() if isinstance(value, datetime) else value


# The API's names of the methods' arguments, to name an argument as the caller wrote it.
_ARGUMENTS = {"delaySecs": "delay_secs", "maxAttempts": "max_attempts",
              "idempotencyKey": "idempotency_key", "tenantId": "tenant_id",
              "createdFrom": "created_from", "createdTo": "created_to",
              "eventId": "event_id", "all": "everything", "eventTypes": "event_types",
              "caPem": "ca_pem"}


def _body(**fields: Any) -> dict[str, Any]:
    """The fields given (left out: not given, so the server's defaults apply); ValueError
    naming the argument for a value JSON cannot carry, before anything is sent."""
    given = {name: value for name, value in fields.items() if value is not None}
    for name, value in given.items():
        # httpx's own encoding would raise TypeError or ValueError naming no argument.
        try:
            json.dumps(value, allow_nan=False)
        except RecursionError:
            raise ValueError(f"{_ARGUMENTS.get(name, name)}: nested too deep to send as "
                             "JSON") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{_ARGUMENTS.get(name, name)}: must be JSON-serialisable "
                             f"(str, int, finite float, bool, None, list, dict): {exc}") from None
    return given


def enqueue_job(kind: str, payload: Mapping[str, Any], *, delay_secs: float | None,
                max_attempts: int | None, priority: int | None, idempotency_key: str | None,
                tenant_id: UUID | str | None) -> Call[Job]:
    return Call("POST", JOBS, _object, json=_body(
        kind=kind, payload=dict(payload), delaySecs=delay_secs, maxAttempts=max_attempts,
        priority=priority, idempotencyKey=idempotency_key,
        tenantId=_uuid(tenant_id)))


def get_job(job_id: UUID | str) -> Call[Job]:
    return Call("GET", f"{JOBS}/{_id(job_id, 'job_id', _JOB_ROUTES)}", _object)


def list_jobs(status: str | None, limit: int) -> Call[list[Job]]:
    return Call("GET", JOBS, _objects, params=_body(status=status, limit=limit))


def list_dlq(limit: int) -> Call[list[Job]]:
    return Call("GET", f"{JOBS}/dlq", _objects, params={"limit": limit})


def retry_job(job_id: UUID | str) -> Call[Job]:
    return Call("POST", f"{JOBS}/{_id(job_id, 'job_id', _JOB_ROUTES)}/retry", _object)


def requeue_dlq(limit: int | None) -> Call[int]:
    return Call("POST", f"{JOBS}/dlq/requeue", _count("requeued"), params=_body(limit=limit))


def discard_job(job_id: UUID | str) -> Call[None]:
    return Call("DELETE", f"{JOBS}/{_id(job_id, 'job_id', _JOB_ROUTES)}", _nothing)


def create_cron_job(name: str, schedule: str, kind: str, payload: Mapping[str, Any] | None,
                    tenant_id: UUID | str | None, priority: int | None,
                    max_attempts: int | None) -> Call[CronEntry]:
    return Call("POST", CRON, _object, json=_body(
        name=name, schedule=schedule, kind=kind, payload=dict(payload or {}),
        tenantId=_uuid(tenant_id), priority=priority, maxAttempts=max_attempts))


def list_cron_jobs() -> Call[list[CronEntry]]:
    return Call("GET", CRON, _objects)


def delete_cron_job(name: str, tenant_id: UUID | str | None) -> Call[None]:
    return Call("DELETE", f"{CRON}/{_name(name)}", _nothing,
                params=_body(tenantId=_uuid(tenant_id)))


def cancel_job(job_id: UUID | str) -> Call[CancelledJob]:
    return Call("POST", f"{JOBS}/{_id(job_id, 'job_id', _JOB_ROUTES)}/cancel", _object)


def cancel_jobs(*, kind: str | None, tenant_id: UUID | str | None,
                created_from: datetime | str | None, created_to: datetime | str | None,
                event_id: UUID | str | None, template: str | None,
                limit: int | None) -> Call[int]:
    return Call("POST", f"{JOBS}/cancel", _count("cancelled"), json=_body(
        kind=kind, tenantId=_uuid(tenant_id), createdFrom=_time(created_from),
        createdTo=_time(created_to), eventId=_uuid(event_id), template=template, limit=limit))


def list_pauses() -> Call[list[Pause]]:
    return Call("GET", PAUSES, _objects)


def _scope(kind: str | None, tenant_id: UUID | str | None, everything: bool) -> dict[str, Any]:
    # `all` is sent only when asked for: false is the API's default.
    return _body(kind=kind, tenantId=_uuid(tenant_id), all=everything or None)


def pause(kind: str | None, tenant_id: UUID | str | None, everything: bool) -> Call[Pause]:
    return Call("POST", PAUSES, _object, json=_scope(kind, tenant_id, everything))


def resume(kind: str | None, tenant_id: UUID | str | None, everything: bool) -> Call[Pause]:
    return Call("POST", f"{PAUSES}/resume", _object, json=_scope(kind, tenant_id, everything))


def list_limits() -> Call[list[Limit]]:
    return Call("GET", LIMITS, _objects)


def list_throttles() -> Call[list[Throttle]]:
    # The same answer as list_limits: the API lists the throttled destinations in its meta.
    return Call("GET", LIMITS, _throttles, reads="meta")


def set_limit(kind: str, *, rate: str | float | None, burst: int | None,
              concurrency: int | None, key: str | None,
              tenant_id: UUID | str | None) -> Call[Limit]:
    return Call("POST", LIMITS, _object, json=_body(
        kind=kind, tenantId=_uuid(tenant_id), rate=rate, burst=burst, concurrency=concurrency,
        key=key))


def remove_limit(kind: str, tenant_id: UUID | str | None) -> Call[Limit]:
    return Call("POST", f"{LIMITS}/remove", _object,
                json=_body(kind=kind, tenantId=_uuid(tenant_id)))


def get_outbox_status() -> Call[OutboxStatus]:
    return Call("GET", f"{OUTBOX}/status", _object)


def get_outbox_event(event_id: UUID | str) -> Call[OutboxEvent]:
    return Call("GET", f"{OUTBOX}/events/{_id(event_id, 'event_id')}", _object)


def replay_outbox(event_id: UUID | str | None, since: datetime | str | None,
                  until: datetime | str | None, dead: bool) -> Call[int]:
    # `dead` is sent only when asked for: false is the API's default.
    return Call("POST", f"{OUTBOX}/replay", _count("replayed"), json=_body(
        eventId=_uuid(event_id), since=_time(since), until=_time(until), dead=dead or None))


def result(call: Call[T], response: httpx.Response) -> T:
    """The answer's `data`, shaped by `call.pick`; an error answer, or data not of the
    shape the call expects, raises ApiError."""
    try:
        body = response.json()
    except (ValueError, RecursionError):  # not JSON, or nested past what Python can read
        body = None
    if response.is_success and isinstance(body, dict) and "data" in body:
        try:
            return call.pick(body[call.reads])
        except (ValueError, KeyError, TypeError) as exc:
            raise ApiError(response.status_code, "unexpected_answer", str(exc)) from None
    retry_after = _retry_after(response.headers.get("retry-after"))
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code, message, field = error.get("code"), error.get("message"), error.get("field")
        raise ApiError(response.status_code, code if isinstance(code, str) else "error",
                       message if isinstance(message, str) else _no_envelope(response),
                       field if isinstance(field, str) else None, retry_after)
    if response.is_redirect:
        # Not followed: the key travels in the apikey header, which httpx would send on to
        # wherever the redirect points.
        raise ApiError(response.status_code, "http_error",
                       f"redirected to {response.headers.get('location') or '(no Location)'};"
                       " the client follows no redirects: give it that URL instead",
                       retry_after=retry_after)
    # Not our envelope (a proxy's error page, say): keep what there is to read.
    raise ApiError(response.status_code, "http_error", _no_envelope(response),
                   retry_after=retry_after)


def _no_envelope(response: httpx.Response) -> str:
    """What an answer without our envelope says: its text, else its reason phrase."""
    said = response.text.strip()[:500]
    return said or f"{response.reason_phrase or 'no reason given'} (empty body)"


def unanswered(call: Call[Any], url: httpx.URL, exc: httpx.RequestError) -> ApiConnectionError:
    """The error for a request that got no answer (connection refused, a name that does not
    resolve, a timeout, a connection closed mid-answer) or one that could not be read."""
    where = f"{call.method} {str(url).rstrip('/')}{call.path}"
    reason = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.DecodingError):  # the request went out and was answered
        return ApiConnectionError("unreadable_answer", f"{where}: the answer could not be "
                                  f"decoded ({reason}); it may have taken effect")
    if isinstance(exc, httpx.TimeoutException):
        # A read timeout comes after the request went out: the server may have done it.
        maybe = "; it may have taken effect" if isinstance(exc, httpx.ReadTimeout) else ""
        return ApiConnectionError("timeout", f"{where}: no answer in time ({reason}){maybe}")
    return ApiConnectionError("connection_failed", f"{where}: {reason}")


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header: a number of seconds or an HTTP date."""
    if value is None:
        return None
    try:
        secs = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        when = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
        secs = (when - datetime.now(UTC)).total_seconds()
    return max(0.0, secs) if math.isfinite(secs) else None


def base_url(url: str) -> str:
    """The API's URL as the client uses it; ValueError for one it cannot send to."""
    # Without this, "localhost:8000" failed only at the first request, as a connection
    # error ("unsupported protocol 'localhost://'") that a caller's retry loop would retry.
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ValueError(f"url: must be an http:// or https:// URL, such as "
                         f"http://127.0.0.1:8000; got {url!r} ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"url: must be an http:// or https:// URL, such as "
                         f"http://127.0.0.1:8000; got {url!r}")
    return url.rstrip("/")


def timeout_secs(value: float | None) -> float | None:
    """The seconds to wait for each step of a request (None: for ever); ValueError for one
    no socket can take."""
    # 0 failed every request as connection_failed ("Operation now in progress"), which a
    # retry loop retries for ever; -1, NaN and infinity failed there with the socket's words.
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"timeout: must be a number of seconds above 0 (or None: no "
                         f"limit); got {value!r}")
    return float(value)


def headers(key: str) -> dict[str, str]:
    """The headers of every request; ValueError for a key no header can carry as it is."""
    # A key read from a file keeps its line break; httpx would refuse it only at the first
    # request, as a protocol error that reads like a network fault.
    if not key or not key.isascii() or not key.isprintable() or key != key.strip():
        raise ValueError("key: must be the API key alone: printable ASCII, without spaces "
                         "or a line break around it")
    return {"apikey": key, "accept": "application/json"}
