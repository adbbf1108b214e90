"""Webhook endpoints: list, read one, add, disable, enable, delete, and one endpoint's
delivery attempts, as `postrelay webhooks` manages them.

A tenant key sees and changes only its own tenant's endpoints: another tenant's endpoint
answers 404 exactly like a missing one, on every route, and every statement reads through
the tenant. The service role sees every tenant's and names the tenant of an endpoint it
adds. No answer carries the signing secret, but the add's (shown once), nor a private CA's
certificates (`private_ca` says only whether there is one).

What the operator disabled stays the operator's: an endpoint the service-role key (or the
CLI) disabled is enabled by the service role alone, a tenant key's enable is refused (403
`disabled_by_operator`) and its disable leaves it as it is. `disabled_by` says who did.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, Field

from postrelay.api.auth import Caller, Principal
from postrelay.api.bodies import JsonBodyRoute
from postrelay.api.common import DIGITS, Db, errors
from postrelay.api.errors import ApiError
from postrelay.api.models import Envelope, _Body
from postrelay.core.errors import ValidationError
from postrelay.core.telemetry import event
from postrelay.relay import (
    WebhookAttempt,
    WebhookEndpoint,
    webhook_add,
    webhook_attempts,
    webhook_disable,
    webhook_enable,
    webhook_get,
    webhook_list,
    webhook_remove,
)

router = APIRouter(prefix="/v1/functions/webhooks", tags=["webhooks"],
                   route_class=JsonBodyRoute)

EndpointId = Annotated[UUID, Path(alias="id", description="The webhook endpoint's id.")]
ATTEMPTS_LIMIT_MAX = 500  # as webhook_attempts and the other lists bound it


class WebhookBody(_Body):
    url: str = Field(description="http:// or https:// URL the events are POSTed to; stored "
                                 "normalised. Loopback and private addresses are refused "
                                 "unless the operator allows them (never for a tenant key).")
    event_types: list[str] | None = Field(
        default=None, alias="eventTypes",
        description="Only these event types; globs such as `order.*` (at most 100). "
                    "Null or empty: every type.")
    ca_pem: str | None = Field(
        default=None, alias="caPem",
        description="PEM CA certificates that the https:// endpoint's deliveries trust "
                    "instead of the default CAs (a private CA); never answered back.")
    tenant_id: UUID | None = Field(
        default=None, alias="tenantId",
        description="The endpoint's tenant: required for the service-role key; a tenant "
                    "key adds to its own tenant.")


class WebhookOut(BaseModel):
    """An endpoint, without its secret or its CA's certificates."""

    id: UUID
    tenant_id: UUID
    url: str
    event_types: list[str] | None = Field(description="Null: every event type.")
    enabled: bool
    disabled_reason: str | None
    disabled_by: Literal["operator", "tenant", "receiver"] | None = Field(
        description="Who disabled it: `operator` (the service-role key, the CLI), `tenant` "
                    "(a tenant key) or `receiver` (it answered 410 Gone); null while "
                    "enabled. A tenant key enables no endpoint an operator disabled.")
    private_ca: bool = Field(description="Whether its deliveries trust a private CA.")
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, found: WebhookEndpoint) -> WebhookOut:
        return cls(id=found.id, tenant_id=found.tenant_id, url=found.url,
                   event_types=found.event_types, enabled=found.enabled,
                   disabled_reason=found.disabled_reason, disabled_by=found.disabled_by,
                   private_ca=found.private_ca,
                   created_at=found.created_at, updated_at=found.updated_at)


class WebhookAdded(BaseModel):
    endpoint: WebhookOut
    secret: str = Field(description="The signing secret (`whsec_…`), shown this once only: "
                                    "give it to the receiver now.")


class WebhookAttemptOut(BaseModel):
    """One HTTP attempt of a delivery."""

    id: int
    job_id: UUID | None
    endpoint_id: UUID
    event_id: UUID
    attempt: int
    status_code: int | None = Field(description="Null: no HTTP answer (see `error`).")
    duration_ms: int
    response_body: str | None = Field(description="The first 2 KB of the answer.")
    error: str | None
    created_at: datetime

    @classmethod
    def of(cls, found: WebhookAttempt) -> WebhookAttemptOut:
        return cls(id=found.id, job_id=found.job_id, endpoint_id=found.endpoint_id,
                   event_id=found.event_id, attempt=found.attempt,
                   status_code=found.status_code, duration_ms=found.duration_ms,
                   response_body=found.response_body, error=found.error,
                   created_at=found.created_at)


class WebhookDeleted(BaseModel):
    id: UUID
    deleted: Literal[True] = True


@router.get("", response_model=Envelope[list[WebhookOut]], responses=errors(400, 401))
def list_webhooks(
    caller: Caller,
    engine: Db,
    tenant_id: Annotated[UUID | None, Query(
        alias="tenantId", description="Only this tenant's (service-role key); a tenant key "
                                      "lists its own.")] = None,
) -> Envelope[list[WebhookOut]]:
    """Every endpoint (a tenant key: its tenant's), oldest first."""
    tenant = caller.tenant_id if tenant_id is None else _own(caller, tenant_id)
    with engine.begin() as conn:
        found = webhook_list(conn, tenant_id=tenant)
    return Envelope(data=[WebhookOut.of(e) for e in found])


@router.post("", status_code=201, response_model=Envelope[WebhookAdded],
             responses=errors(400, 401))
def add_webhook(body: WebhookBody, caller: Caller, engine: Db, request: Request,
                response: Response) -> Envelope[WebhookAdded]:
    """Add an enabled endpoint; the answer carries its signing secret, this once only.

    The URL is normalised and checked as `postrelay webhooks add` checks it (400 naming
    `url`); loopback and private addresses are refused for a tenant key always, and for the
    service-role key unless POSTRELAY_WEBHOOK_ALLOW_PRIVATE is set. `caPem` is for an
    https:// URL, and must be CA certificates valid now (400 naming `caPem`)."""
    if caller.tenant_id is None:  # the service role
        if body.tenant_id is None:
            raise ApiError(400, "tenantId: the service-role key names the endpoint's tenant",
                           field="tenantId")
        tenant = body.tenant_id
        allow_private = bool(request.app.state.settings.webhook_allow_private)
    else:
        tenant = _own(caller, body.tenant_id or caller.tenant_id)
        # The setting is the operator's for their own receivers: a tenant key must not
        # point deliveries at addresses inside the installation's network, neither now nor
        # through a host name that resolves there later (private_allowed).
        allow_private = False
    with engine.begin() as conn, _for_tenant_keys(caller):
        endpoint, secret = webhook_add(conn, tenant, body.url, event_types=body.event_types,
                                       allow_private=allow_private, ca_pem=body.ca_pem,
                                       private_allowed=caller.tenant_id is None)
    response.headers["Cache-Control"] = "no-store"  # the secret: no copy in any cache
    event("postrelay.api.webhook_add", logging.INFO, endpoint_id=str(endpoint.id),
          tenant_id=str(endpoint.tenant_id), actor=caller.actor)
    return Envelope(data=WebhookAdded(endpoint=WebhookOut.of(endpoint), secret=secret))


@router.get("/{id}", response_model=Envelope[WebhookOut], responses=errors(400, 401, 404))
def get_webhook(endpoint_id: EndpointId, caller: Caller, engine: Db) -> Envelope[WebhookOut]:
    """One endpoint; another tenant's is not found, exactly like a missing one."""
    with engine.begin() as conn:
        found = webhook_get(conn, endpoint_id, tenant_id=caller.tenant_id)
    return Envelope(data=WebhookOut.of(found))


@router.post("/{id}/disable", response_model=Envelope[WebhookOut],
             responses=errors(400, 401, 404))
def disable_webhook(endpoint_id: EndpointId, caller: Caller,
                    engine: Db) -> Envelope[WebhookOut]:
    """Stop delivering to the endpoint; its queued deliveries stop unsent. The reason
    recorded names the key that disabled it, and `disabled_by` whether it was the service
    role (`operator`) or a tenant key (`tenant`). A tenant key's disable of an endpoint
    the operator disabled answers it unchanged: it stays the operator's to enable."""
    with engine.begin() as conn:
        found = webhook_disable(conn, endpoint_id, reason=f"disabled by {caller.actor}",
                                tenant_id=caller.tenant_id)
    event("postrelay.api.webhook_disable", logging.INFO, endpoint_id=str(endpoint_id),
          actor=caller.actor)
    return Envelope(data=WebhookOut.of(found))


@router.post("/{id}/enable", response_model=Envelope[WebhookOut],
             responses=errors(400, 401, 403, 404))
def enable_webhook(endpoint_id: EndpointId, caller: Caller,
                   engine: Db) -> Envelope[WebhookOut]:
    """Deliver to the endpoint again, events from now on; what it missed while disabled
    is sent by replaying those events (`POST /v1/functions/outbox/replay`).

    A tenant key enables what a tenant key or the receiver (a 410 Gone) disabled; one the
    operator disabled (the service-role key, the CLI) is refused with 403
    `disabled_by_operator`, nothing changed. The service-role key enables any."""
    with engine.begin() as conn:
        found = webhook_enable(conn, endpoint_id, tenant_id=caller.tenant_id)
    event("postrelay.api.webhook_enable", logging.INFO, endpoint_id=str(endpoint_id),
          actor=caller.actor)
    return Envelope(data=WebhookOut.of(found))


@router.delete("/{id}", response_model=Envelope[WebhookDeleted],
               responses=errors(400, 401, 404))
def delete_webhook(endpoint_id: EndpointId, caller: Caller,
                   engine: Db) -> Envelope[WebhookDeleted]:
    """Delete the endpoint and its delivery log; its queued deliveries stop unsent."""
    with engine.begin() as conn:
        webhook_remove(conn, endpoint_id, tenant_id=caller.tenant_id)
    event("postrelay.api.webhook_delete", logging.INFO, endpoint_id=str(endpoint_id),
          actor=caller.actor)
    return Envelope(data=WebhookDeleted(id=endpoint_id))


@router.get("/{id}/attempts", response_model=Envelope[list[WebhookAttemptOut]],
            responses=errors(400, 401, 404))
def list_webhook_attempts(
    endpoint_id: EndpointId,
    caller: Caller,
    engine: Db,
    limit: Annotated[int, Query(ge=1, le=ATTEMPTS_LIMIT_MAX), DIGITS] = 50,
) -> Envelope[list[WebhookAttemptOut]]:
    """The endpoint's delivery attempts, newest first (kept
    POSTRELAY_WEBHOOK_ATTEMPT_RETENTION_DAYS); `limit` between 1 and 500 (default 50).
    Another tenant's endpoint is not found, exactly like a missing one."""
    with engine.begin() as conn:
        # The 404 first: an endpoint without attempts and one that is not the caller's
        # must not both answer an empty list.
        webhook_get(conn, endpoint_id, tenant_id=caller.tenant_id)
        found = webhook_attempts(conn, endpoint_id=endpoint_id, limit=limit,
                                 tenant_id=caller.tenant_id)
    return Envelope(data=[WebhookAttemptOut.of(a) for a in found])


@contextmanager
def _for_tenant_keys(caller: Principal) -> Iterator[None]:
    """A private address refused to a tenant key is not the setting's to allow: the rule
    must not send a tenant to an operator's setting that would not change the answer."""
    try:
        yield
    except ValidationError as exc:
        hint = "; set POSTRELAY_WEBHOOK_ALLOW_PRIVATE"
        if caller.is_service_role or exc.field != "url" or hint not in exc.rule:
            raise
        raise ValidationError("url", exc.rule.split(hint)[0] + "; a tenant key adds "
                                     "endpoints at public addresses only") from None


def _own(caller: Principal, given: UUID) -> UUID:
    """A tenant key acts for its own tenant only; naming another is refused."""
    if caller.tenant_id is not None and given != caller.tenant_id:
        raise ApiError(400, "tenantId: a tenant key can only act for its own tenant",
                       field="tenantId")
    return given
