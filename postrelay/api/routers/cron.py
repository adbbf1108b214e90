"""Cron entries: create, list, delete by name. There is no update: delete and create again."""

from __future__ import annotations

import logging
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query

from postrelay.api.auth import Caller
from postrelay.api.bodies import JsonBodyRoute
from postrelay.api.common import Db, errors, tenant_for_write
from postrelay.api.models import CronBody, CronDeleted, CronOut, Envelope
from postrelay.core.errors import NotFoundError
from postrelay.core.telemetry import event
from postrelay.orchestrator import check_job_payload
from postrelay.queue import check_kind, cron_create, cron_delete, cron_list

router = APIRouter(prefix="/v1/functions/cron", tags=["cron"], route_class=JsonBodyRoute)


@router.post("", status_code=201, response_model=Envelope[CronOut],
             responses=errors(400, 401, 403, 409))
def create_cron_job(body: CronBody, caller: Caller, engine: Db) -> Envelope[CronOut]:
    """Create an entry; each firing enqueues one job with the payload frozen now. A 5-field
    schedule is stored with a leading `0` seconds field; aliases such as `@daily` are 400.

    Names are unique per tenant: 409 only when this tenant has the name already. Names
    starting `postrelay.` are the system's (403 `name_reserved`); the kinds a tenant key
    may not enqueue it may not schedule either (403 `kind_reserved`). An `email_send`
    payload is checked as a job's is at enqueue (400 naming `payload.to[0]`), since every
    firing enqueues it."""
    tenant = tenant_for_write(caller, body.tenant_id)
    check_kind(body.kind, tenant, tenant_key=not caller.is_service_role)
    check_job_payload(body.kind, body.payload)
    with engine.begin() as conn:
        entry = cron_create(
            conn, body.name, body.schedule, body.kind, body.payload, tenant_id=tenant,
            priority=body.priority if body.priority is not None else 100,
            max_attempts=body.max_attempts, created_by=caller.actor,
        )
    event("postrelay.api.cron_create", name=entry.name, actor=caller.actor)
    return Envelope(data=CronOut.of(entry))


@router.get("", response_model=Envelope[list[CronOut]], responses=errors(401))
def list_cron_jobs(caller: Caller, engine: Db) -> Envelope[list[CronOut]]:
    """Every entry (a tenant key: its tenant's), by name, with its last and next run."""
    with engine.begin() as conn:
        entries = cron_list(conn, tenant_id=caller.tenant_id)
    return Envelope(data=[CronOut.of(e) for e in entries])


@router.delete("/{name}", response_model=Envelope[CronDeleted],
               responses=errors(400, 401, 403, 404))
def delete_cron_job(
    name: str,
    caller: Caller,
    engine: Db,
    tenant_id: Annotated[UUID | None, Query(
        alias="tenantId",
        description="The entry's tenant (service-role key): needed when several tenants "
                    "have an entry of this name. A tenant key deletes its own.")] = None,
) -> Envelope[CronDeleted]:
    """Delete by name; it never fires again. Unknown name (or another tenant's): 404.
    The built-in `postrelay.*` entries cannot be deleted (403 `name_reserved`)."""
    if "\x00" in name:  # cannot name any entry, and PostgreSQL refuses NUL in text
        raise NotFoundError(f"no cron entry named {name!r}")
    tenant = caller.tenant_id
    if tenant_id is not None:
        tenant = tenant_for_write(caller, tenant_id)
    with engine.begin() as conn:
        cron_delete(conn, name, tenant_id=tenant, actor=caller.actor)
    event("postrelay.api.cron_delete", logging.INFO, name=name, actor=caller.actor)
    return Envelope(data=CronDeleted(name=name))
