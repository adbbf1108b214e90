"""Cron entries: the list with last and next run; create and delete through queue.cron, so
the validation messages are the API's (field names spelled as the API spells them).

The form follows queue/reserved.py as the API does: a tenant session is not offered, and
may not post, the kinds reserved for the system or for trusted code; nobody may create or
delete a `postrelay.*` entry. Names are per tenant, so a delete names the entry's tenant."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import TypeAdapter
from pydantic import ValidationError as PydanticValidationError
from sqlalchemy import Engine

from postrelay.access import API_FIELD_NAMES, MaxAttempts, Priority
from postrelay.core import jsontext
from postrelay.core.errors import ConflictError, ForbiddenError, NotFoundError, ValidationError
from postrelay.core.telemetry import event
from postrelay.dashboard.web import (
    CurrentUser,
    Db,
    Form,
    User,
    first,
    notice_of,
    optional_uuid,
    pretty_json,
    redirect_with_notice,
    render,
    tenant_names,
)
from postrelay.orchestrator import check_job_payload
from postrelay.queue import (
    RESERVED_CRON_PREFIX,
    SYSTEM_TENANT_ID,
    TENANT_FORBIDDEN_KINDS,
    check_kind,
    cron_create,
    cron_delete,
    cron_list,
    job_kinds,
)

router = APIRouter()

FIELDS = ("name", "schedule", "kind", "payload", "tenant", "priority", "max_attempts")
_PRIORITY: TypeAdapter[int] = TypeAdapter(Priority)
_MAX_ATTEMPTS: TypeAdapter[int] = TypeAdapter(MaxAttempts)


@router.get("/cron")
def cron_page(request: Request, user: CurrentUser, engine: Db, notice: str = "",
              sig: str = "") -> HTMLResponse:
    return _page(request, user, engine, {}, None, notice_of(request, notice, sig), 200)


@router.post("/cron")
def cron_add(request: Request, user: CurrentUser, engine: Db, form: Form) -> Response:
    values = {f: first(form, f) or "" for f in FIELDS}
    try:
        arguments = _arguments(user, values)
        check_kind(arguments["kind"], arguments["tenant_id"], tenant_key=not user.is_service_role)
        # As the API and `postrelay cron add` check it: every firing enqueues the payload.
        check_job_payload(arguments["kind"], arguments["payload"])
        with engine.begin() as conn:
            entry = cron_create(conn, **arguments, created_by=user.actor)
    except ValidationError as exc:
        field = API_FIELD_NAMES.get(exc.field, exc.field)
        return _page(request, user, engine, values, f"{field}: {exc.rule}", None, 400)
    except ForbiddenError as exc:
        return _page(request, user, engine, values, exc.message, None, 403)
    except ConflictError as exc:
        return _page(request, user, engine, values, str(exc), None, 409)
    event("postrelay.dashboard.cron_create", name=entry.name, actor=user.actor)
    return redirect_with_notice(request, "/cron", f"Created {entry.name}.")


@router.post("/cron/{name}/delete")
def cron_remove(request: Request, name: str, user: CurrentUser, engine: Db,
                form: Form) -> Response:
    if "\x00" in name:  # cannot name any entry, and PostgreSQL refuses NUL in text
        raise NotFoundError(f"no cron entry named {name!r}")
    # A tenant session deletes its own; the service role the tenant the form names.
    tenant = user.tenant_id or optional_uuid("tenant", first(form, "tenant"))
    with engine.begin() as conn:
        cron_delete(conn, name, tenant_id=tenant, actor=user.actor)
    event("postrelay.dashboard.cron_delete", name=name, actor=user.actor)
    return redirect_with_notice(request, "/cron", f"Deleted {name}.")


def _arguments(user: User, values: dict[str, str]) -> dict[str, Any]:
    """The form's text as cron_create's arguments. Numbers that do not parse are passed on
    as they are, so that cron_create refuses them with its own message."""
    for field, value in values.items():
        if "\x00" in value or "\\u0000" in value:
            raise ValidationError(field, "must not contain NUL characters")
    # Not valid JSON, or nested past what the parser can recurse through: a ValidationError.
    payload = jsontext.parse_document(values["payload"] or "{}", "payload")
    tenant = optional_uuid("tenant_id", values["tenant"])
    if user.tenant_id is not None:
        if tenant is not None and tenant != user.tenant_id:
            raise ValidationError("tenant_id", "a tenant key can only act for its own tenant")
        tenant = user.tenant_id
    return {
        "name": values["name"].strip(), "schedule": values["schedule"],
        "kind": values["kind"], "payload": payload,
        "tenant_id": tenant or SYSTEM_TENANT_ID,
        "priority": _number("priority", values["priority"], 100, _PRIORITY),
        "max_attempts": _number("max_attempts", values["max_attempts"], None, _MAX_ATTEMPTS),
    }


def _number(field: str, text: str, default: int | None, rule: TypeAdapter[int]) -> Any:
    """The form's number checked by the API's own type, so a bad one gets the API's message."""
    if not text.strip():
        return default
    try:
        value: Any = int(text.strip())
    except ValueError:
        value = text
    try:
        return rule.validate_python(value)
    except PydanticValidationError as exc:
        raise ValidationError(field, exc.errors()[0]["msg"]) from None


def _page(request: Request, user: User, engine: Engine, values: dict[str, str], error: str | None,
          flash: str | None, status: int) -> HTMLResponse:
    with engine.begin() as conn:
        entries = cron_list(conn, tenant_id=user.tenant_id)
        kinds = job_kinds(conn)
        if not user.is_service_role:
            kinds = [k for k in kinds if k not in TENANT_FORBIDDEN_KINDS]
        tenants = tenant_names(conn, user)
    return render(request, "cron.html", {
        "entries": entries, "kinds": kinds, "tenants": tenants, "values": values,
        "error": error, "flash": flash, "pretty_json": pretty_json,
        "system_tenant": SYSTEM_TENANT_ID, "reserved_prefix": RESERVED_CRON_PREFIX,
    }, user=user, status=status)
