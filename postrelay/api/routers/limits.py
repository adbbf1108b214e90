"""Limits: list, set, remove. The service role limits any kind, kind-wide or within a
tenant; a tenant key only within its own tenant, and sees its own limits and the kind-wide
ones that govern its jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter
from pydantic import BaseModel, BeforeValidator, Field

from postrelay.access import check_limit_change
from postrelay.api.auth import Caller, Principal
from postrelay.api.bodies import JsonBodyRoute
from postrelay.api.common import Db, errors
from postrelay.api.errors import ApiError
from postrelay.api.models import Envelope, _Body
from postrelay.queue import Limit, Throttle, limit_list, limit_remove, limit_set, throttle_list

router = APIRouter(prefix="/v1/functions/limits", tags=["limits"], route_class=JsonBodyRoute)


def _not_a_bool(value: Any) -> Any:
    # pydantic reads JSON true as the number 1.0 for a float: a rate of one per second.
    if isinstance(value, bool):
        raise ValueError("must be a rate such as 14/s or 1000/min, or a number per second")
    return value


Rate = Annotated[str | float, BeforeValidator(_not_a_bool)]
# strict: JSON true is not the count 1, nor "5" the count 5.
Count = Annotated[int, Field(strict=True)]


class LimitBody(_Body):
    kind: str = Field(description="The job kind it limits.")
    tenant_id: UUID | None = Field(default=None, alias="tenantId",
                                   description="Only this tenant's jobs (its own limit).")
    rate: Rate | None = Field(default=None, description="14/s, 1000/min, or per second.")
    burst: Count | None = Field(default=None, description="Claims at once on top of the rate.")
    concurrency: Count | None = Field(default=None, description="At most this many running.")
    key: str | None = Field(default=None, description="Limit each value of this payload field "
                                                      "apart (dots for nested fields).")


class LimitScope(_Body):
    kind: str
    tenant_id: UUID | None = Field(default=None, alias="tenantId")


class LimitOut(BaseModel):
    kind: str
    tenant_id: UUID | None = Field(serialization_alias="tenantId")
    key: str | None
    rate_per_sec: float | None = Field(serialization_alias="ratePerSec")
    burst: int | None
    concurrency: int | None
    created_by: str = Field(serialization_alias="createdBy")
    created_at: datetime = Field(serialization_alias="createdAt")

    @classmethod
    def of(cls, found: Limit) -> LimitOut:
        return cls(kind=found.kind, tenant_id=found.tenant_id, key=found.key,
                   rate_per_sec=found.rate_per_sec, burst=found.burst,
                   concurrency=found.concurrency, created_by=found.created_by,
                   created_at=found.created_at)


class ThrottleOut(BaseModel):
    """A destination throttled now, after it refused work (SMTP 421/454, HTTP 429/503)."""

    kind: str
    key: str | None = Field(description="The payload field naming the destination; null: "
                                        "the kind as a whole (the SMTP server).")
    value: str = Field(description="That field's value, e.g. the webhook endpoint's id.")
    tenant_id: UUID | None = Field(serialization_alias="tenantId")
    rate_per_sec: float = Field(serialization_alias="ratePerSec",
                                description="What it allows now; 0 while paused.")
    recovers_to: float | None = Field(serialization_alias="recoversTo",
                                      description="The configured rate it steps back up "
                                                  "to; null: unlimited.")
    reason: str = Field(description="The reply that caused it, the latest if several.")
    refusals: int
    since: datetime
    paused_until: datetime = Field(serialization_alias="pausedUntil")
    until: datetime = Field(description="When it ends, if refused no more.")

    @classmethod
    def of(cls, found: Throttle) -> ThrottleOut:
        return cls(kind=found.kind, key=".".join(found.key_path) if found.key_path else None,
                   value=found.key, tenant_id=found.tenant_id, rate_per_sec=found.rate_now,
                   recovers_to=found.recovers_to, reason=found.reason,
                   refusals=found.refusals, since=found.started_at,
                   paused_until=found.paused_until, until=found.ends_at)


@router.get("", response_model=Envelope[list[LimitOut]], response_model_by_alias=True,
            responses=errors(401))
def limits_list(caller: Caller, engine: Db) -> Envelope[list[LimitOut]]:
    """Every limit (for a tenant key: its own and the kind-wide ones). `meta.throttled`
    lists the destinations throttled now (ThrottleOut: for a tenant key, its own and the
    shared SMTP server)."""
    with engine.begin() as conn:
        found = limit_list(conn, tenant_id=caller.tenant_id)
        throttled = throttle_list(conn, tenant_id=caller.tenant_id)
    return Envelope(data=[LimitOut.of(f) for f in found],
                    meta={"throttled": [ThrottleOut.of(t).model_dump(mode="json", by_alias=True)
                                        for t in throttled]})


@router.post("", response_model=Envelope[LimitOut], response_model_by_alias=True,
             responses=errors(400, 401, 403))
def limits_set(body: LimitBody, caller: Caller, engine: Db) -> Envelope[LimitOut]:
    """Set (or replace) the limit of a kind, optionally within a tenant: a rate with a
    burst and/or a concurrency cap, optionally per payload key. Workers apply it within a
    second. A tenant key changes no limit the operator set, and sets none on a kind the
    operator limited for every tenant (403 `operator_limit`, `kind_wide_limit`)."""
    tenant = _tenant(caller, body.tenant_id)
    with engine.begin() as conn:
        if tenant is not None and not caller.is_service_role:
            check_limit_change(conn, tenant_id=tenant, kind=body.kind, setting=True)
        found = limit_set(conn, actor=caller.actor, kind=body.kind, tenant_id=tenant,
                          rate=body.rate, burst=body.burst, concurrency=body.concurrency,
                          key=body.key)
    return Envelope(data=LimitOut.of(found))


@router.post("/remove", response_model=Envelope[LimitOut], response_model_by_alias=True,
             responses=errors(400, 401, 403, 404))
def limits_remove(body: LimitScope, caller: Caller, engine: Db) -> Envelope[LimitOut]:
    """Remove the limit of exactly this kind (and tenant); 404 if there is none. A tenant
    key removes no limit the operator set (403 `operator_limit`)."""
    tenant = _tenant(caller, body.tenant_id)
    with engine.begin() as conn:
        if tenant is not None and not caller.is_service_role:
            check_limit_change(conn, tenant_id=tenant, kind=body.kind, setting=False)
        found = limit_remove(conn, actor=caller.actor, kind=body.kind, tenant_id=tenant)
    return Envelope(data=LimitOut.of(found))


def _tenant(caller: Principal, given: UUID | None) -> UUID | None:
    """A tenant key acts within its own tenant only: its limits always name it."""
    if caller.tenant_id is None:
        return given
    if given is not None and given != caller.tenant_id:
        raise ApiError(400, "tenantId: a tenant key can only act for its own tenant",
                       field="tenantId")
    return caller.tenant_id
