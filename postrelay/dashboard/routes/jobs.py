"""Jobs: one status at a time (each in the order its index gives), filtered by kind,
tenant and time; found by id or idempotency key; one job's payload, attempts, timestamps,
last error and audit trail."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from types import SimpleNamespace
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy import Connection

from postrelay.core.errors import NotFoundError, ValidationError
from postrelay.dashboard import queries
from postrelay.dashboard.web import (
    CurrentUser,
    Db,
    Form,
    optional_time,
    optional_uuid,
    page_number,
    pretty_json,
    redirect,
    render,
    scope,
    tenant_names,
)
from postrelay.orchestrator import cancel_job
from postrelay.queue import STATUSES, job_get, job_kinds

router = APIRouter()

DEFAULT_STATUS = "running"
# The time each status is listed and filtered by, and its direction.
TIME_COLUMN = {"pending": "Due", "running": "Started", "done": "Finished",
               "failed": "Finished", "dlq": "Dead-lettered"}


@router.get("/jobs")
def jobs_page(request: Request, user: CurrentUser, engine: Db, status: str = DEFAULT_STATUS,
              kind: str = "", tenant: str = "", since: str = "", until: str = "",
              q: str = "", page: str = "1") -> Response:
    filters = {"status": status, "kind": kind, "tenant": tenant, "since": since,
               "until": until, "q": q.strip()}
    with engine.begin() as conn:
        kinds = job_kinds(conn)
        tenants = tenant_names(conn, user)
        if filters["q"]:
            found = _search(conn, filters["q"], user.tenant_id)
            if len(found) == 1:
                return redirect(request, f"/jobs/{found[0].id}")
            return render(request, "jobs.html", {
                "rows": found, "more": False, "filters": filters, "kinds": kinds,
                "tenants": tenants, "time_column": "Created", "page": 1, "searched": True,
            }, user=user)
        if status not in STATUSES:
            raise ValidationError("status", f"must be one of {', '.join(STATUSES)}")
        if kind and kind not in kinds:
            raise ValidationError("kind", f"unknown job kind {kind!r}")
        page_no = page_number(page)
        rows = queries.job_list(
            conn, status=status, kind=kind or None,
            tenant_id=scope(user, optional_uuid("tenant", tenant)),
            since=optional_time("since", since), until=optional_time("until", until),
            page=page_no)
    return render(request, "jobs.html", {
        "rows": rows[:queries.PAGE_SIZE], "more": len(rows) > queries.PAGE_SIZE,
        "filters": filters, "kinds": kinds, "tenants": tenants,
        "time_column": TIME_COLUMN[status], "page": page_no, "searched": False,
    }, user=user)


@router.get("/jobs/{job_id}")
def job_page(request: Request, job_id: str, user: CurrentUser, engine: Db) -> HTMLResponse:
    ident = _job_id(job_id)
    with engine.begin() as conn:
        job = job_get(conn, ident, tenant_id=user.tenant_id)
        if job is None:
            raise NotFoundError(f"no job {ident}")
        audit = queries.job_audit(conn, ident, user.tenant_id)
        origin = queries.job_origin(conn, ident, user.tenant_id)
        emails = queries.job_emails(conn, ident, user.tenant_id)
        tenants = tenant_names(conn, user)
    return render(request, "job.html", {
        "job": job, "payload": pretty_json(job.payload), "audit": audit, "origin": origin,
        "emails": emails, "tenants": tenants, "pretty_json": pretty_json,
    }, user=user)


@router.post("/jobs/{job_id}/cancel")
def job_cancel_action(request: Request, job_id: str, user: CurrentUser, engine: Db,
                      form: Form) -> Response:
    """Cancel one pending, scheduled or running job, as `postrelay jobs cancel` does (same
    audit row, the dashboard's user as actor); another tenant's job is a 404 page, a
    finished one a 409 page."""
    ident = _job_id(job_id)
    with engine.begin() as conn:
        cancel_job(conn, ident, actor=user.actor, tenant_id=user.tenant_id)
    return redirect(request, f"/jobs/{ident}")


def _search(conn: Connection, text: str, tenant_id: UUID | None) -> Sequence[Any]:
    """A job id, else an idempotency key (which may name jobs of several kinds)."""
    try:
        ident = UUID(text)
    except ValueError:
        ident = None
    if ident is not None:
        job = job_get(conn, ident, tenant_id=tenant_id)
        if job is not None:
            return [SimpleNamespace(**asdict(job), at=job.created_at)]
    return queries.job_find_by_key(conn, text, tenant_id)


def _job_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise NotFoundError(f"no job {text!r}") from None
