"""Cancelling jobs: one by id, or up to 1000 by filter. A tenant key cancels only its own
tenant's jobs: another tenant's job is a 404, and a bulk cancel is scoped to its tenant.
Included before the jobs router (app.py)."""

from __future__ import annotations

from uuid import UUID

from fastapi import APIRouter
from pydantic import BaseModel, Field

from postrelay.api.auth import Caller
from postrelay.api.bodies import JsonBodyRoute
from postrelay.api.common import Db, JobId, errors
from postrelay.api.errors import ApiError
from postrelay.api.models import Envelope, Moment, _Body
from postrelay.orchestrator import cancel_job, cancel_jobs
from postrelay.queue import CANCEL_LIMIT_MAX

router = APIRouter(prefix="/v1/functions/jobs", tags=["jobs"], route_class=JsonBodyRoute)


class CancelBody(_Body):
    kind: str | None = Field(default=None, description="Only jobs of this kind.")
    tenant_id: UUID | None = Field(default=None, alias="tenantId",
                                   description="Only this tenant's jobs (service role).")
    created_from: Moment | None = Field(default=None, alias="createdFrom")
    created_to: Moment | None = Field(default=None, alias="createdTo")
    event_id: UUID | None = Field(default=None, alias="eventId",
                                  description="Only jobs made from this outbox event.")
    template: str | None = Field(default=None,
                                 description="Only email_send jobs of this template.")
    # strict: JSON true is not the limit 1, nor "5" the limit 5.
    limit: int = Field(default=CANCEL_LIMIT_MAX, strict=True, ge=1, le=CANCEL_LIMIT_MAX)


class CancelledOne(BaseModel):
    id: UUID
    was: str


class CancelledMany(BaseModel):
    cancelled: int


@router.post("/cancel", response_model=Envelope[CancelledMany], responses=errors(400, 401))
def cancel_many(body: CancelBody, caller: Caller, engine: Db) -> Envelope[CancelledMany]:
    """Cancel up to `limit` (at most 1000) pending or running jobs matching every filter
    given, oldest first; at least one filter. Call again while the count equals the limit."""
    tenant = body.tenant_id
    if caller.tenant_id is not None:
        if tenant is not None and tenant != caller.tenant_id:
            raise ApiError(400, "tenantId: a tenant key can only act for its own tenant",
                           field="tenantId")
        tenant = caller.tenant_id
    with engine.begin() as conn:
        cancelled = cancel_jobs(
            conn, actor=caller.actor, tenant_id=tenant, kind=body.kind,
            created_from=body.created_from, created_to=body.created_to,
            event_id=body.event_id, template=body.template, limit=body.limit)
    return Envelope(data=CancelledMany(cancelled=len(cancelled)))


@router.post("/{id}/cancel", response_model=Envelope[CancelledOne],
             responses=errors(400, 401, 404, 409))
def cancel_one(job_id: JobId, caller: Caller, engine: Db) -> Envelope[CancelledOne]:
    """Cancel a pending, scheduled or running job: it becomes `failed` with who and when in
    `lastError`; a running job's handler is cancelled within a second. 409 if it already
    finished, 404 if there is no such job (or it is another tenant's)."""
    with engine.begin() as conn:
        cancelled = cancel_job(conn, job_id, actor=caller.actor, tenant_id=caller.tenant_id)
    return Envelope(data=CancelledOne(id=cancelled.id, was=cancelled.was))
