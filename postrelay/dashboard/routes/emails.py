"""The email log: filtered by tenant, recipient, status, template and time; one message's
whole story (event → job → attempts → log rows with the SMTP replies → the delivery
feedback that came back later, from orchestrator.admin.email_story) and a preview of what
was sent."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy import Engine

from postrelay.core.errors import NotFoundError
from postrelay.dashboard import preview, queries
from postrelay.dashboard.web import (
    CurrentUser,
    Db,
    User,
    optional_time,
    optional_uuid,
    page_number,
    pretty_json,
    render,
    scope,
    tenant_names,
)
from postrelay.orchestrator import email_list, email_story

router = APIRouter()

@router.get("/emails")
def emails_page(request: Request, user: CurrentUser, engine: Db, tenant: str = "",
                recipient: str = "", status: str = "", template: str = "", since: str = "",
                until: str = "", page: str = "1") -> HTMLResponse:
    filters = {"tenant": tenant, "recipient": recipient.strip(), "status": status,
               "template": template.strip(), "since": since, "until": until}
    page_no = page_number(page)
    with engine.begin() as conn:
        rows = email_list(
            conn, tenant_id=scope(user, optional_uuid("tenant", tenant)),
            recipient=filters["recipient"] or None, status=status or None,
            template=filters["template"] or None, since=optional_time("since", since),
            until=optional_time("until", until), limit=queries.PAGE_SIZE + 1,
            offset=(page_no - 1) * queries.PAGE_SIZE)
        tenants = tenant_names(conn, user)
    return render(request, "emails.html", {
        "rows": rows[:queries.PAGE_SIZE], "more": len(rows) > queries.PAGE_SIZE,
        "filters": filters, "tenants": tenants, "page": page_no,
    }, user=user)


@router.get("/emails/{log_id}")
def email_page(request: Request, log_id: str, user: CurrentUser, engine: Db) -> HTMLResponse:
    story, tenants, shown = _story_shown(request, engine, log_id, user)
    log = story["log"]
    return render(request, "email.html", {
        "log": log, "event": story["event"], "job": story["job"], "steps": _steps(story),
        "tenants": tenants, "pretty_json": pretty_json,
        "preview": shown,
    }, user=user)


@router.get("/emails/{log_id}/preview")
def email_preview(request: Request, log_id: str, user: CurrentUser, engine: Db) -> Response:
    """The message's HTML part alone, for the story page's sandboxed frame."""
    _, _, shown = _story_shown(request, engine, log_id, user)
    if shown.html is None:
        raise NotFoundError("this message has no HTML part to show")
    return HTMLResponse(shown.html, headers={"content-security-policy": preview.PREVIEW_CSP,
                                             "x-frame-options": "SAMEORIGIN"})


def _story_shown(request: Request, engine: Engine, log_id: str, user: User
                 ) -> tuple[dict[str, Any], dict[UUID, str], preview.Preview]:
    """The message's story, the tenant names, and the message as the template renders it."""
    story, tenants = _story(engine, log_id, user)
    log = story["log"]
    shown = preview.of(request.app.state.email_templates, log, story["job"],
                       tenants.get(UUID(str(log["tenant_id"])), ""), story["event"])
    return story, tenants, shown


def _story(engine: Engine, log_id: str, user: User) -> tuple[dict[str, Any], dict[UUID, str]]:
    try:
        ident = UUID(log_id)
    except ValueError:
        raise NotFoundError(f"no email log row {log_id!r}") from None
    with engine.begin() as conn:
        story = email_story(conn, ident, tenant_id=user.tenant_id)
        tenants = tenant_names(conn, user)
    return story, tenants


def _steps(story: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """What happened after the job was made, in time order: its attempts (when made), the
    feedback about them (when received) and its audit rows (a retry, a cancel), each as
    (attempt | feedback | audit, row)."""
    timed = [*((a["created_at"], "attempt", a) for a in story["attempts"]),
             *((f["received_at"], "feedback", f) for f in story.get("feedback") or []),
             *((a["created_at"], "audit", a) for a in story["audit"])]
    return [(kind, row) for _, kind, row in sorted(timed, key=lambda step: step[0])]
