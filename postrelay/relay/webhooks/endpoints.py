"""Managing a tenant's webhook endpoints. Each function takes the caller's connection or
session (sync or async SQLAlchemy; await the result with an async one) and never commits.

    with engine.begin() as conn:
        endpoint, secret = webhook_add(conn, tenant, "https://example.com/hooks",
                                       event_types=["order.*"])
    # give `secret` to the receiver now: it is not shown again
        webhook_set_ca(conn, endpoint.id, open("internal-ca.pem").read())  # a private CA

Every change sends NOTIFY postrelay_webhooks at commit, so running relays see it at once.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, overload
from uuid import UUID

from postrelay.core.dbcall import (
    AnyConnection,
    AsyncAnyConnection,
    Steps,
    SyncConnection,
    drive,
)
from postrelay.core.errors import ForbiddenError, NotFoundError, ValidationError
from postrelay.core.limits import checked_text
from postrelay.core.sqlfiles import load_queries
from postrelay.relay.webhooks.signing import new_secret
from postrelay.relay.webhooks.trust import validate_ca_pem
from postrelay.relay.webhooks.urls import validate_url

WEBHOOK_SQL = load_queries("postrelay.relay.webhooks", "sql/webhooks.sql")

MAX_EVENT_TYPES = 100
# Who disabled an endpoint: an operator (no tenant_id: the CLI, the service-role key, code),
# the tenant (a tenant_id given: its API key) or the receiver (the worker, on a 410 Gone).
DisabledBy = Literal["operator", "tenant", "receiver"]
# The ForbiddenError code of a tenant's enable of an endpoint an operator disabled.
DISABLED_BY_OPERATOR = "disabled_by_operator"
_EVENT_TYPE = re.compile(r"^\S{1,200}$")


@dataclass(frozen=True, slots=True)
class WebhookEndpoint:
    """An endpoint as operators see it; the secret is deliberately not part of it, nor is
    its private CA: `private_ca` says only whether it has one."""

    id: UUID
    tenant_id: UUID
    url: str
    event_types: list[str] | None
    enabled: bool
    disabled_reason: str | None
    disabled_by: DisabledBy | None  # None while enabled
    created_at: datetime
    updated_at: datetime
    private_ca: bool

    @classmethod
    def from_row(cls, row: Any) -> WebhookEndpoint:
        m = row._mapping
        return cls(m["id"], m["tenant_id"], m["url"], m["event_types"], m["enabled"],
                   m["disabled_reason"], m["disabled_by"], m["created_at"], m["updated_at"],
                   m["private_ca"])


# Each function returns its value on a sync connection and an awaitable of it on an async
# one; the overloads tell a type checker which.
@overload
def webhook_add(
    conn: SyncConnection, tenant_id: UUID | str, url: str, *,
    event_types: Iterable[str] | None = ..., allow_private: bool = ...,
    ca_pem: str | None = ..., private_allowed: bool = ...,
) -> tuple[WebhookEndpoint, str]: ...
@overload
def webhook_add(
    conn: AsyncAnyConnection, tenant_id: UUID | str, url: str, *,
    event_types: Iterable[str] | None = ..., allow_private: bool = ...,
    ca_pem: str | None = ..., private_allowed: bool = ...,
) -> Awaitable[tuple[WebhookEndpoint, str]]: ...
def webhook_add(
    conn: AnyConnection,
    tenant_id: UUID | str,
    url: str,
    *,
    event_types: Iterable[str] | None = None,
    allow_private: bool = False,
    ca_pem: str | None = None,
    private_allowed: bool = True,
) -> tuple[WebhookEndpoint, str] | Awaitable[tuple[WebhookEndpoint, str]]:
    """Add an enabled endpoint; returns it with its new `whsec_…` secret (shown only now).

    `event_types` are exact types or globs (`order.*`); None or empty means every type.
    The URL is stored as `validate_url` normalises it; `allow_private` (the CLI passes
    POSTRELAY_WEBHOOK_ALLOW_PRIVATE) lets it name a loopback or private address.
    `private_allowed=False` (an endpoint a tenant adds) keeps its deliveries from every
    such address whatever its host name resolves to then, even where the worker's setting
    lets an operator's endpoints reach them.
    `ca_pem`, for an https:// URL, is a private CA's certificates (PEM text) that its
    deliveries trust instead of the default bundle (trust.py).
    """
    valid_url = validate_url(url, allow_private=allow_private)
    if ca_pem is not None and not valid_url.startswith("https://"):
        raise _not_https(valid_url)
    params = {"tenant_id": _uuid("tenant_id", tenant_id), "url": valid_url,
              "event_types": _event_types(event_types), "secret": new_secret(),
              "ca_pem": None if ca_pem is None else validate_ca_pem(ca_pem),
              "private_allowed": bool(private_allowed)}
    return drive(conn, _add_steps(params))


def _add_steps(params: dict[str, Any]) -> Steps[tuple[WebhookEndpoint, str]]:
    rows = yield WEBHOOK_SQL["webhook_endpoint_insert"], params
    if not rows:
        raise ValidationError("tenant_id", f"no tenant with id {params['tenant_id']}")
    return WebhookEndpoint.from_row(rows[0]), params["secret"]


@overload
def webhook_list(
    conn: SyncConnection, *, tenant_id: UUID | str | None = ...
) -> list[WebhookEndpoint]: ...
@overload
def webhook_list(
    conn: AsyncAnyConnection, *, tenant_id: UUID | str | None = ...
) -> Awaitable[list[WebhookEndpoint]]: ...
def webhook_list(
    conn: AnyConnection, *, tenant_id: UUID | str | None = None
) -> list[WebhookEndpoint] | Awaitable[list[WebhookEndpoint]]:
    """Every endpoint (of one tenant, if given), oldest first."""
    tenant = None if tenant_id is None else _uuid("tenant_id", tenant_id)
    return drive(conn, _list_steps(tenant))


def _list_steps(tenant: UUID | None) -> Steps[list[WebhookEndpoint]]:
    rows = yield WEBHOOK_SQL["webhook_endpoint_list"], {"tenant_id": tenant}
    return [WebhookEndpoint.from_row(r) for r in rows]


@overload
def webhook_get(
    conn: SyncConnection, endpoint_id: UUID | str, *, tenant_id: UUID | str | None = ...
) -> WebhookEndpoint: ...
@overload
def webhook_get(
    conn: AsyncAnyConnection, endpoint_id: UUID | str, *, tenant_id: UUID | str | None = ...
) -> Awaitable[WebhookEndpoint]: ...
def webhook_get(
    conn: AnyConnection, endpoint_id: UUID | str, *, tenant_id: UUID | str | None = None
) -> WebhookEndpoint | Awaitable[WebhookEndpoint]:
    """One endpoint; NotFoundError if there is none of that id (of that tenant, if given)."""
    params = {"id": _uuid("endpoint_id", endpoint_id),
              "tenant_id": None if tenant_id is None else _uuid("tenant_id", tenant_id)}
    return drive(conn, _get_steps(params))


def _get_steps(params: dict[str, Any]) -> Steps[WebhookEndpoint]:
    rows = yield WEBHOOK_SQL["webhook_endpoint_get"], params
    if not rows:
        raise NotFoundError(f"no webhook endpoint with id {params['id']}")
    return WebhookEndpoint.from_row(rows[0])


@overload
def webhook_set_ca(
    conn: SyncConnection, endpoint_id: UUID | str, ca_pem: str | None, *,
    tenant_id: UUID | str | None = ...,
) -> WebhookEndpoint: ...
@overload
def webhook_set_ca(
    conn: AsyncAnyConnection, endpoint_id: UUID | str, ca_pem: str | None, *,
    tenant_id: UUID | str | None = ...,
) -> Awaitable[WebhookEndpoint]: ...
def webhook_set_ca(
    conn: AnyConnection, endpoint_id: UUID | str, ca_pem: str | None, *,
    tenant_id: UUID | str | None = None,
) -> WebhookEndpoint | Awaitable[WebhookEndpoint]:
    """Trust `ca_pem` (a private CA's certificates, PEM text) for the endpoint's HTTPS
    instead of the default bundle, from its next delivery on; None trusts the default
    bundle again. ValidationError("ca_pem", ...) for a CA that does not load or an
    http:// endpoint; nothing is written then."""
    params = {"id": _uuid("endpoint_id", endpoint_id),
              "ca_pem": None if ca_pem is None else validate_ca_pem(ca_pem),
              "tenant_id": None if tenant_id is None else _uuid("tenant_id", tenant_id)}
    return drive(conn, _set_ca_steps(params))


def _set_ca_steps(params: dict[str, Any]) -> Steps[WebhookEndpoint]:
    rows = yield WEBHOOK_SQL["webhook_endpoint_set_ca"], params
    if rows:
        return WebhookEndpoint.from_row(rows[0])
    # Nothing changed: no such endpoint (of that tenant), or an http:// one given a CA.
    found = yield WEBHOOK_SQL["webhook_endpoint_get"], params
    if not found:
        raise NotFoundError(f"no webhook endpoint with id {params['id']}")
    raise _not_https(found[0].url)


def _not_https(url: str) -> ValidationError:
    return ValidationError("ca_pem", f"a private CA is for https:// endpoints only, and {url} "
                                     "is http://")


@overload
def webhook_disable(
    conn: SyncConnection, endpoint_id: UUID | str, *, reason: str | None = ...,
    tenant_id: UUID | str | None = ...,
) -> WebhookEndpoint: ...
@overload
def webhook_disable(
    conn: AsyncAnyConnection, endpoint_id: UUID | str, *, reason: str | None = ...,
    tenant_id: UUID | str | None = ...,
) -> Awaitable[WebhookEndpoint]: ...
def webhook_disable(
    conn: AnyConnection, endpoint_id: UUID | str, *, reason: str | None = None,
    tenant_id: UUID | str | None = None,
) -> WebhookEndpoint | Awaitable[WebhookEndpoint]:
    """Stop delivering to the endpoint. Jobs already queued for it stop as `failed`.

    Without `tenant_id` an operator disables it (`disabled_by` 'operator', whoever had
    disabled it before), and only an operator enables it again. With `tenant_id` the
    tenant does ('tenant'); an endpoint an operator disabled is answered unchanged, its
    disable still the operator's. `reason` defaults to saying which of the two disabled it."""
    if reason is None:
        reason = "disabled by an operator" if tenant_id is None else "disabled by the tenant"
    if not isinstance(reason, str) or not reason.strip():
        raise ValidationError("reason", "must be a non-empty string")
    checked_text(reason, "reason")
    return _set_enabled(conn, endpoint_id, False, reason.strip(), tenant_id)


@overload
def webhook_enable(
    conn: SyncConnection, endpoint_id: UUID | str, *, tenant_id: UUID | str | None = ...
) -> WebhookEndpoint: ...
@overload
def webhook_enable(
    conn: AsyncAnyConnection, endpoint_id: UUID | str, *, tenant_id: UUID | str | None = ...
) -> Awaitable[WebhookEndpoint]: ...
def webhook_enable(
    conn: AnyConnection, endpoint_id: UUID | str, *, tenant_id: UUID | str | None = None
) -> WebhookEndpoint | Awaitable[WebhookEndpoint]:
    """Deliver to the endpoint again, events from now on. What it missed while disabled
    (its deliveries stopped unsent, and events with no delivery for it) is delivered by
    replaying those events (`outbox_replay`, `postrelay outbox replay --since ...`).

    With `tenant_id` (a tenant's own call) an endpoint that an operator disabled is not
    the tenant's to enable: ForbiddenError `disabled_by_operator`, nothing written. What
    the tenant or the receiver (a 410 Gone) disabled, it enables; an operator (no
    `tenant_id`) enables any."""
    return _set_enabled(conn, endpoint_id, True, None, tenant_id)


def _set_enabled(
    conn: AnyConnection, endpoint_id: UUID | str, enabled: bool, reason: str | None,
    tenant_id: UUID | str | None,
) -> WebhookEndpoint | Awaitable[WebhookEndpoint]:
    tenant = None if tenant_id is None else _uuid("tenant_id", tenant_id)
    by: DisabledBy | None = None if enabled else "operator" if tenant is None else "tenant"
    params = {"id": _uuid("endpoint_id", endpoint_id), "enabled": enabled, "reason": reason,
              "disabled_by": by, "tenant_id": tenant}
    return drive(conn, _set_enabled_steps(params))


def _set_enabled_steps(params: dict[str, Any]) -> Steps[WebhookEndpoint]:
    while True:
        rows = yield WEBHOOK_SQL["webhook_endpoint_set_enabled"], params
        if rows:
            return WebhookEndpoint.from_row(rows[0])
        # Nothing changed: no such endpoint (of that tenant), or the tenant's call met one
        # an operator disabled, which the statement's guard leaves as it is.
        found = yield WEBHOOK_SQL["webhook_endpoint_get"], params
        if not found:
            raise NotFoundError(f"no webhook endpoint with id {params['id']}")
        endpoint = WebhookEndpoint.from_row(found[0])
        if endpoint.disabled_by == "operator":
            if params["enabled"]:
                raise ForbiddenError(
                    DISABLED_BY_OPERATOR,
                    f"webhook endpoint {endpoint.id} was disabled by an operator "
                    f"({endpoint.disabled_reason}); only an operator enables it")
            return endpoint  # a tenant's disable: it stays the operator's
        # An operator enabled it between the two statements: the guard lets it by now.


@overload
def webhook_remove(
    conn: SyncConnection, endpoint_id: UUID | str, *, tenant_id: UUID | str | None = ...
) -> None: ...
@overload
def webhook_remove(
    conn: AsyncAnyConnection, endpoint_id: UUID | str, *, tenant_id: UUID | str | None = ...
) -> Awaitable[None]: ...
def webhook_remove(
    conn: AnyConnection, endpoint_id: UUID | str, *, tenant_id: UUID | str | None = None
) -> None | Awaitable[None]:
    """Delete the endpoint and its delivery log. Jobs already queued for it stop as `failed`."""
    params = {"id": _uuid("endpoint_id", endpoint_id),
              "tenant_id": None if tenant_id is None else _uuid("tenant_id", tenant_id)}
    return drive(conn, _remove_steps(params))


def _remove_steps(params: dict[str, Any]) -> Steps[None]:
    rows = yield WEBHOOK_SQL["webhook_endpoint_delete"], params
    if not rows:
        raise NotFoundError(f"no webhook endpoint with id {params['id']}")


def _event_types(event_types: Iterable[str] | None) -> list[str] | None:
    if event_types is None:
        return None
    if isinstance(event_types, str):
        raise ValidationError("event_types", "must be a list of event types, not one string")
    types: Sequence[str] = list(dict.fromkeys(event_types))  # once each, in order
    if len(types) > MAX_EVENT_TYPES:
        raise ValidationError("event_types", f"at most {MAX_EVENT_TYPES} entries")
    for t in types:
        if not isinstance(t, str) or not _EVENT_TYPE.fullmatch(t):
            raise ValidationError(
                "event_types",
                f"{t!r}: an event type or glob (`order.*`) of 1 to 200 characters, no spaces",
            )
        checked_text(t, "event_types")  # `\S` lets a NUL or a lone surrogate through
    return list(types) or None


def _uuid(field: str, value: UUID | str) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        raise ValidationError(field, f"must be a UUID, got {value!r}") from None


@dataclass(frozen=True, slots=True)
class WebhookAttempt:
    id: int
    job_id: UUID | None
    endpoint_id: UUID
    event_id: UUID
    attempt: int
    status_code: int | None
    duration_ms: int
    response_body: str | None
    error: str | None
    created_at: datetime


@overload
def webhook_attempts(
    conn: SyncConnection, *, endpoint_id: UUID | str | None = ...,
    event_id: UUID | str | None = ..., limit: int = ..., tenant_id: UUID | str | None = ...,
) -> list[WebhookAttempt]: ...
@overload
def webhook_attempts(
    conn: AsyncAnyConnection, *, endpoint_id: UUID | str | None = ...,
    event_id: UUID | str | None = ..., limit: int = ..., tenant_id: UUID | str | None = ...,
) -> Awaitable[list[WebhookAttempt]]: ...
def webhook_attempts(
    conn: AnyConnection, *, endpoint_id: UUID | str | None = None,
    event_id: UUID | str | None = None, limit: int = 50, tenant_id: UUID | str | None = None,
) -> list[WebhookAttempt] | Awaitable[list[WebhookAttempt]]:
    """The delivery log, newest first, of one endpoint and/or one event; only the attempts
    of `tenant_id`'s endpoints, if given."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 500:
        raise ValidationError("limit", "must be an integer from 1 to 500")
    params = {"endpoint_id": None if endpoint_id is None else _uuid("endpoint_id", endpoint_id),
              "event_id": None if event_id is None else _uuid("event_id", event_id),
              "tenant_id": None if tenant_id is None else _uuid("tenant_id", tenant_id),
              "limit": limit}
    return drive(conn, _attempts_steps(params))


def _attempts_steps(params: dict[str, Any]) -> Steps[list[WebhookAttempt]]:
    rows = yield WEBHOOK_SQL["webhook_attempt_list"], params
    return [WebhookAttempt(*r) for r in rows]
