"""The dead-letter queue: select jobs (or every job matching the filter), confirm, then
retry or discard them with queue.admin's dlq_retry / dlq_discard, so each job gets the same
audit row as through the API or the CLI (the actor is the dashboard's user).

The confirmation lists the jobs it counted, each with when it was dead-lettered, and the
action applies to those alone: a job that dead-letters (or is dead-lettered again, after a
retry elsewhere) after the operator read the count is not retried or discarded on the
strength of a page that never showed it."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from postrelay.core.errors import NotFoundError, ValidationError
from postrelay.core.telemetry import event
from postrelay.dashboard import queries
from postrelay.dashboard.web import (
    CurrentUser,
    Db,
    Form,
    User,
    first,
    notice_of,
    optional_time,
    optional_uuid,
    redirect_with_notice,
    render,
    scope,
    tenant_names,
)
from postrelay.queue import REQUEUE_LIMIT_MAX, dlq_discard, dlq_retry, job_kinds

router = APIRouter()

SHOWN = 100
ACTIONS = {"retry": ("Retry", "retried"), "discard": ("Discard", "discarded")}
FILTER_FIELDS = ("kind", "tenant", "since", "until")


@router.get("/dlq")
def dlq_page(request: Request, user: CurrentUser, engine: Db, kind: str = "", tenant: str = "",
             since: str = "", until: str = "", notice: str = "",
             sig: str = "") -> HTMLResponse:
    filters = {"kind": kind, "tenant": tenant, "since": since, "until": until}
    with engine.begin() as conn:
        kinds = job_kinds(conn)
        where = _where(user, filters, kinds)
        rows = queries.dlq_matching(conn, limit=SHOWN, **where)
        total = queries.dlq_count(conn, **where)
        tenants = tenant_names(conn, user)
    return render(request, "dlq.html", {
        "rows": rows, "total": total, "filters": filters, "kinds": kinds, "tenants": tenants,
        "flash": notice_of(request, notice, sig), "limit": REQUEUE_LIMIT_MAX,
    }, user=user)


@router.post("/dlq/confirm")
def dlq_confirm(request: Request, user: CurrentUser, engine: Db, form: Form) -> Response:
    """The confirmation step: what is about to happen, to how many jobs."""
    action = _action(form)
    filters = {f: first(form, f) or "" for f in FILTER_FIELDS}
    matching = first(form, "scope") == "matching"
    with engine.begin() as conn:
        if matching:
            where = _where(user, filters, job_kinds(conn))
            rows = queries.dlq_matching(conn, limit=REQUEUE_LIMIT_MAX, **where)
        else:
            rows = queries.dlq_by_ids(conn, _ids(form), user.tenant_id)
        sample, count = rows[:10], len(rows)
        tenants = tenant_names(conn, user)
    if count == 0:  # nothing to confirm: say why (the page works without its script)
        return redirect_with_notice(request, "/dlq", _why_none(matching, form), **filters)
    return render(request, "dlq_confirm.html", {
        "action": action, "verb": ACTIONS[action][0], "count": count,
        "ids": [_confirmed_id(r.id, r.at) for r in rows],
        "matching": matching, "filters": filters, "sample": sample, "tenants": tenants,
    }, user=user)


@router.post("/dlq/apply")
def dlq_apply(request: Request, user: CurrentUser, engine: Db, form: Form) -> Response:
    action = _action(form)
    filters = {f: first(form, f) or "" for f in FILTER_FIELDS}
    done = skipped = again = 0
    apply = dlq_retry if action == "retry" else dlq_discard
    confirmed = _ids_confirmed(form)  # the jobs the confirmation listed, "all matching" too
    with engine.begin() as conn:
        # Locked until the end: no retry or death elsewhere between the check and the action.
        dead_at = queries.dlq_lock_ids(conn, list(confirmed), user.tenant_id)
        for job_id, shown in confirmed.items():
            if job_id in dead_at and shown is not _UNSEEN and dead_at[job_id] != shown:
                again += 1  # retried and dead-lettered again since the confirmation
                continue
            try:
                apply(conn, job_id, actor=user.actor, tenant_id=user.tenant_id)
                done += 1
            except NotFoundError:  # retried or discarded meanwhile, or another tenant's
                skipped += 1
    event("postrelay.dashboard.dlq_" + action, count=done, skipped=skipped + again,
          actor=user.actor)
    notice = f"{done:,} job{'' if done == 1 else 's'} {ACTIONS[action][1]}" + (
        f"; {skipped:,} had already left the DLQ" if skipped else "") + (
        f"; {again:,} {'was' if again == 1 else 'were'} dead-lettered again since, left alone"
        if again else "") + "."
    return redirect_with_notice(request, "/dlq", notice, **filters)


def _where(user: User, filters: dict[str, str], kinds: list[str]) -> dict[str, Any]:
    kind = filters["kind"] or None
    if kind is not None and kind not in kinds:
        raise ValidationError("kind", f"unknown job kind {kind!r}")
    since: datetime | None = optional_time("since", filters["since"])
    return {"tenant_id": scope(user, optional_uuid("tenant", filters["tenant"])),
            "kind": kind, "since": since, "until": optional_time("until", filters["until"])}


def _why_none(matching: bool, form: dict[str, list[str]]) -> str:
    if matching:
        return "No dead job matches this filter."
    if not any(ident.strip() for ident in form.get("ids", [])):
        return "No job was checked: check the jobs to act on, or all matching the filter."
    return "The jobs checked are no longer in the dead-letter queue."


def _action(form: dict[str, list[str]]) -> str:
    action = first(form, "action") or ""
    if action not in ACTIONS:
        raise ValidationError("action", "must be retry or discard")
    return action


def _ids(form: dict[str, list[str]]) -> list[UUID]:
    return list(_ids_confirmed(form))


# A job id posted alone (a checkbox of the DLQ page): acted on whenever it died.
_UNSEEN: Any = object()


def _confirmed_id(job_id: UUID, dead_at: datetime | None) -> str:
    """`<id>@<when it was dead-lettered>`, as the confirmation page posts each job."""
    return f"{job_id}@{dead_at.isoformat() if dead_at is not None else ''}"


def _ids_confirmed(form: dict[str, list[str]]) -> dict[UUID, Any]:
    """The posted jobs, each with the dead-letter time the confirmation showed (None: it
    had none), or _UNSEEN for an id posted alone."""
    ids = form.get("ids", [])
    if len(ids) > REQUEUE_LIMIT_MAX:
        raise ValidationError("ids", f"at most {REQUEUE_LIMIT_MAX} jobs at a time")
    confirmed: dict[UUID, Any] = {}
    for value in ids:
        ident, marked, at = value.partition("@")
        job_id = optional_uuid("ids", ident)
        if job_id is None:  # an empty field
            continue
        confirmed.setdefault(job_id, optional_time("ids", at) if marked else _UNSEEN)
    return confirmed
