"""Pauses: list, pause, resume. The service role pauses any scope; a tenant key only its
own tenant, or a kind within it, and sees its own pauses and the installation-wide ones."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from fastapi import APIRouter, Response
from pydantic import BaseModel, Field

from postrelay.access import check_resume
from postrelay.api.auth import Caller, Principal
from postrelay.api.bodies import JsonBodyRoute
from postrelay.api.common import Db, errors
from postrelay.api.errors import ApiError
from postrelay.api.models import Envelope, _Body
from postrelay.queue import Pause, pause, pause_list, resume

router = APIRouter(prefix="/v1/functions/pauses", tags=["pauses"], route_class=JsonBodyRoute)


class PauseBody(_Body):
    kind: str | None = Field(default=None, description="Only jobs of this kind.")
    tenant_id: UUID | None = Field(default=None, alias="tenantId",
                                   description="Only this tenant's jobs.")
    # strict: 1 or "yes" is not true; pausing every job takes a plain JSON true.
    all: bool = Field(default=False, strict=True,
                      description="Every job (service role; no kind or tenant).")


class PauseOut(BaseModel):
    kind: str | None
    tenant_id: UUID | None = Field(serialization_alias="tenantId")
    paused_by: str = Field(serialization_alias="pausedBy")
    paused_at: datetime = Field(serialization_alias="pausedAt")

    @classmethod
    def of(cls, found: Pause) -> PauseOut:
        return cls(kind=found.kind, tenant_id=found.tenant_id, paused_by=found.paused_by,
                   paused_at=found.paused_at)


@router.get("", response_model=Envelope[list[PauseOut]], response_model_by_alias=True,
            responses=errors(401))
def pauses_list(caller: Caller, engine: Db) -> Envelope[list[PauseOut]]:
    """What is paused, oldest first (for a tenant key: its own pauses and the
    installation-wide ones)."""
    with engine.begin() as conn:
        found = pause_list(conn, tenant_id=caller.tenant_id)
    return Envelope(data=[PauseOut.of(p) for p in found])


@router.post("", response_model=Envelope[PauseOut], response_model_by_alias=True,
             status_code=201,
             responses={200: {"model": Envelope[PauseOut],
                              "description": "Paused already: who paused it, and since when."},
                        **errors(400, 401)})
def pauses_create(body: PauseBody, caller: Caller, engine: Db,
                  response: Response) -> Envelope[PauseOut]:
    """Pause a kind, a tenant, a kind within a tenant, or everything (`all`): workers stop
    claiming its jobs within a second; running ones finish. 201 when paused now, 200 when it
    was paused already (the answer names who paused it and since when)."""
    tenant = _tenant(caller, body)
    with engine.begin() as conn:
        found, created = pause(conn, actor=caller.actor, kind=body.kind, tenant_id=tenant,
                               everything=body.all)
    if not created:
        response.status_code = 200
    return Envelope(data=PauseOut.of(found))


@router.post("/resume", response_model=Envelope[PauseOut], response_model_by_alias=True,
             responses=errors(400, 401, 403, 404))
def pauses_resume(body: PauseBody, caller: Caller, engine: Db) -> Envelope[PauseOut]:
    """Lift the pause of exactly this scope; 404 if it is not paused. A tenant key lifts
    only the pauses tenant keys made (403 `operator_pause` for one the operator made)."""
    tenant = _tenant(caller, body)
    with engine.begin() as conn:
        if tenant is not None and not caller.is_service_role:
            check_resume(conn, tenant_id=tenant, kind=body.kind)
        found = resume(conn, actor=caller.actor, kind=body.kind, tenant_id=tenant,
                       everything=body.all)
    return Envelope(data=PauseOut.of(found))


def _tenant(caller: Principal, body: PauseBody) -> UUID | None:
    """A tenant key acts for its own tenant only: its scope always names it."""
    if caller.tenant_id is None:
        return body.tenant_id
    if body.all:
        raise ApiError(400, "all: a tenant key can pause only its own tenant's jobs",
                       field="all")
    if body.tenant_id is not None and body.tenant_id != caller.tenant_id:
        raise ApiError(400, "tenantId: a tenant key can only act for its own tenant",
                       field="tenantId")
    return caller.tenant_id
