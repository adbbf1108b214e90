"""Flow control: what is paused, since when and by whom, the rate and concurrency limits,
and the destinations throttled after refusing work; pause a kind, a tenant, a kind within a
tenant, or everything, and resume; set and remove limits. Through queue.pauses and
queue.limits, as the CLI and the API do, so the audit rows and the messages are theirs. A
tenant session sees its own pauses and limits and the installation-wide ones, and changes
them only within its own tenant, and not those the operator made (access/controls.py)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy import Engine

from postrelay.access import API_FIELD_NAMES, check_limit_change, check_resume
from postrelay.core.errors import ForbiddenError, NotFoundError, ValidationError
from postrelay.dashboard.web import (
    CurrentUser,
    Db,
    Form,
    User,
    first,
    notice_of,
    optional_uuid,
    redirect_with_notice,
    render,
    tenant_names,
)
from postrelay.queue import (
    job_kinds,
    limit_list,
    limit_remove,
    limit_set,
    pause,
    pause_list,
    resume,
    throttle_list,
)

router = APIRouter()


@router.get("/pauses")
def pauses_page(request: Request, user: CurrentUser, engine: Db, notice: str = "",
                sig: str = "") -> HTMLResponse:
    return _page(request, user, engine, {}, notice_of(request, notice, sig), None, 200)


@router.post("/pauses")
def pauses_apply(request: Request, user: CurrentUser, engine: Db, form: Form) -> Response:
    """`action` pause or resume; `kind`, `tenant` (a tenant session's own, whatever is
    sent), `all` (service role only)."""
    values = {f: first(form, f) or "" for f in ("action", "kind", "tenant", "all")}
    try:
        action = values["action"]
        if action not in ("pause", "resume"):
            raise ValidationError("action", "must be pause or resume")
        everything = values["all"] == "1"
        tenant = _tenant(user, optional_uuid("tenant", values["tenant"]), everything)
        with engine.begin() as conn:
            if action == "resume" and tenant is not None and not user.is_service_role:
                check_resume(conn, tenant_id=tenant, kind=values["kind"] or None)
            call = pause if action == "pause" else resume
            found: Any = call(conn, actor=user.actor, kind=values["kind"] or None,
                              tenant_id=tenant, everything=everything)
    except ValidationError as exc:
        field = API_FIELD_NAMES.get(exc.field, exc.field)
        return _page(request, user, engine, values, None, f"{field}: {exc.rule}", 400)
    except NotFoundError as exc:
        return _page(request, user, engine, values, None, str(exc), 404)
    except ForbiddenError as exc:
        return _page(request, user, engine, values, None, exc.message, 403)
    shown = (found[0] if action == "pause" else found).describe()
    return redirect_with_notice(request, "/pauses", f"{action}d {shown}")


LIMIT_FIELDS = ("action", "kind", "tenant", "rate", "burst", "concurrency", "key")


@router.post("/limits")
def limits_apply(request: Request, user: CurrentUser, engine: Db, form: Form) -> Response:
    """`action` set or remove; `kind`, `tenant` (a tenant session's own, whatever is sent),
    and for set `rate`, `burst`, `concurrency`, `key` (blank: none)."""
    values = {f: (first(form, f) or "").strip() for f in LIMIT_FIELDS}
    try:
        action = values["action"]
        if action not in ("set", "remove"):
            raise ValidationError("action", "must be set or remove")
        tenant = _tenant(user, optional_uuid("tenant", values["tenant"]), False)
        with engine.begin() as conn:
            if tenant is not None and not user.is_service_role:
                check_limit_change(conn, tenant_id=tenant, kind=values["kind"],
                                   setting=action == "set")
            if action == "set":
                found = limit_set(
                    conn, actor=user.actor, kind=values["kind"], tenant_id=tenant,
                    rate=values["rate"] or None, burst=_number("burst", values["burst"]),
                    concurrency=_number("concurrency", values["concurrency"]),
                    key=values["key"] or None)
            else:
                found = limit_remove(conn, actor=user.actor, kind=values["kind"],
                                     tenant_id=tenant)
    except ValidationError as exc:
        field = API_FIELD_NAMES.get(exc.field, exc.field)
        return _page(request, user, engine, values, None, f"{field}: {exc.rule}", 400)
    except NotFoundError as exc:
        return _page(request, user, engine, values, None, str(exc), 404)
    except ForbiddenError as exc:
        return _page(request, user, engine, values, None, exc.message, 403)
    done = "limit set" if action == "set" else "limit removed"
    return redirect_with_notice(request, "/pauses", f"{done}: {found.describe()}")


def _number(field: str, text: str) -> int | None:
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValidationError(field, f"must be a whole number, got {text[:20]!r}") from None


def _tenant(user: User, requested: UUID | None, everything: bool) -> UUID | None:
    if user.is_service_role:
        return requested
    if everything:
        raise ValidationError("all", "a tenant session can pause only its own tenant's jobs")
    return user.tenant_id


def _page(request: Request, user: User, engine: Engine, values: dict[str, str],
          flash: str | None, error: str | None, status: int) -> HTMLResponse:
    with engine.begin() as conn:
        pauses = pause_list(conn, tenant_id=user.tenant_id)
        limits = limit_list(conn, tenant_id=user.tenant_id)
        throttled = throttle_list(conn, tenant_id=user.tenant_id)
        kinds = job_kinds(conn)
        tenants = tenant_names(conn, user)
    return render(request, "pauses.html", {
        "pauses": pauses, "limits": limits, "throttled": throttled, "kinds": kinds,
        "tenants": tenants, "values": values,
        "flash": flash, "error": error,
    }, user=user, status=status)
