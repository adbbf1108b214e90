"""Jobs: enqueue, read one, list by status."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

# The module, not `from postrelay.queue import enqueue`: that name is also the queue's module
# postrelay.queue.enqueue, which the layer contracts would read as a reach-in.
import postrelay.queue as pq
from postrelay.api.auth import Caller
from postrelay.api.bodies import JsonBodyRoute
from postrelay.api.common import DIGITS, Db, JobId, errors, tenant_for_write
from postrelay.api.models import EnqueueBody, Envelope, JobOut, JobStatus
from postrelay.core.errors import NotFoundError
from postrelay.orchestrator import check_job_payload
from postrelay.queue import LIST_LIMIT_MAX, check_kind, job_get, job_list

router = APIRouter(prefix="/v1/functions/jobs", tags=["jobs"], route_class=JsonBodyRoute)


@router.post("", status_code=201, response_model=Envelope[JobOut],
             responses=errors(400, 401, 403))
def enqueue_job(
    body: EnqueueBody, caller: Caller, engine: Db, request: Request
) -> Envelope[JobOut]:
    """Enqueue a job. With an `idempotencyKey` already used for this tenant and kind, the
    first job comes back instead of a new one (same answer as the first call).

    A tenant key may not enqueue the system's kinds (`cleanup_jobs`) nor those reserved
    for trusted code (`email_send`, `outbox_dispatch`): 403 `kind_reserved`. The
    service-role key may enqueue `cleanup_jobs` only into the system tenant.

    An `email_send` payload is checked as `enqueue_email` checks a message (addresses,
    template, context, ...): a bad one is a 400 naming its field (`payload.to[0]`), and
    nothing is written, rather than a job that fails at its first run."""
    settings = request.app.state.settings
    tenant = tenant_for_write(caller, body.tenant_id)
    check_kind(body.kind, tenant, tenant_key=not caller.is_service_role)
    check_job_payload(body.kind, body.payload)
    max_attempts = body.max_attempts if body.max_attempts is not None else settings.job_max_retries
    with engine.begin() as conn:
        job_id = pq.enqueue(
            conn, body.kind, body.payload, tenant_id=tenant,
            priority=body.priority if body.priority is not None else 100,
            delay=body.delay_secs, max_attempts=max_attempts,
            idempotency_key=body.idempotency_key, created_by=caller.actor,
        )
        job = job_get(conn, job_id)
    assert job is not None  # written (or found) in this very transaction
    return Envelope(data=JobOut.of(job))


@router.get("", response_model=Envelope[list[JobOut]], responses=errors(400, 401))
def list_jobs(
    caller: Caller,
    engine: Db,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this status.")] = None,
    limit: Annotated[int, Query(ge=1, le=LIST_LIMIT_MAX), DIGITS] = 50,
) -> Envelope[list[JobOut]]:
    """Jobs, newest first; `limit` between 1 and 500 (default 50)."""
    with engine.begin() as conn:
        jobs = job_list(conn, status=status, tenant_id=caller.tenant_id, limit=limit)
    return Envelope(data=[JobOut.of(j) for j in jobs])


@router.get("/{id}", response_model=Envelope[JobOut], responses=errors(400, 401, 404))
def get_job(job_id: JobId, caller: Caller, engine: Db) -> Envelope[JobOut]:
    """One job. Another tenant's job is not found, exactly like a missing one."""
    with engine.begin() as conn:
        job = job_get(conn, job_id, tenant_id=caller.tenant_id)
    if job is None:
        raise NotFoundError(f"no job {job_id}")
    return Envelope(data=JobOut.of(job))
