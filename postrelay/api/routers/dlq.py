"""The dead-letter queue: list, retry one, requeue all (up to 1000), discard one.

Mutations are audited with the caller's identity (`api:service-role`, `api:key:<name>`).
This router is included before the jobs router, so `/jobs/dlq` is never read as a job id.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from postrelay.api.auth import Caller
from postrelay.api.bodies import JsonBodyRoute
from postrelay.api.common import DIGITS, Db, JobId, errors
from postrelay.api.models import Discarded, Envelope, JobOut, Requeued
from postrelay.queue import (
    LIST_LIMIT_MAX,
    REQUEUE_LIMIT_MAX,
    dlq_discard,
    dlq_list,
    dlq_requeue,
    dlq_retry,
)

router = APIRouter(prefix="/v1/functions/jobs", tags=["dlq"], route_class=JsonBodyRoute)


@router.get("/dlq", response_model=Envelope[list[JobOut]], responses=errors(400, 401))
def list_dlq(
    caller: Caller,
    engine: Db,
    limit: Annotated[int, Query(ge=1, le=LIST_LIMIT_MAX), DIGITS] = 50,
) -> Envelope[list[JobOut]]:
    """Dead jobs, the most recently dead-lettered first."""
    with engine.begin() as conn:
        jobs = dlq_list(conn, tenant_id=caller.tenant_id, limit=limit)
    return Envelope(data=[JobOut.of(j) for j in jobs])


@router.post("/dlq/requeue", response_model=Envelope[Requeued], responses=errors(400, 401))
def requeue_dlq(
    caller: Caller,
    engine: Db,
    limit: Annotated[int, Query(ge=1, le=REQUEUE_LIMIT_MAX), DIGITS] = REQUEUE_LIMIT_MAX,
) -> Envelope[Requeued]:
    """Send dead jobs back to `pending` (oldest deaths first, at most 1000 per call),
    attempts kept. Call again while the count equals the limit to drain a larger DLQ."""
    with engine.begin() as conn:
        count = dlq_requeue(conn, actor=caller.actor, tenant_id=caller.tenant_id, limit=limit)
    return Envelope(data=Requeued(requeued=count))


@router.post("/{id}/retry", response_model=Envelope[JobOut], responses=errors(400, 401, 404))
def retry_job(job_id: JobId, caller: Caller, engine: Db) -> Envelope[JobOut]:
    """Give one dead job exactly one more attempt: back to `pending`, attempts NOT reset,
    so it returns to the DLQ if that attempt fails. 404 if it is not in the DLQ."""
    with engine.begin() as conn:
        job = dlq_retry(conn, job_id, actor=caller.actor, tenant_id=caller.tenant_id)
    return Envelope(data=JobOut.of(job))


@router.delete("/{id}", response_model=Envelope[Discarded], responses=errors(400, 401, 404))
def discard_job(job_id: JobId, caller: Caller, engine: Db) -> Envelope[Discarded]:
    """Delete one dead job (its audit row keeps a copy). 404 if it is not in the DLQ."""
    with engine.begin() as conn:
        dlq_discard(conn, job_id, actor=caller.actor, tenant_id=caller.tenant_id)
    return Envelope(data=Discarded(id=job_id))
