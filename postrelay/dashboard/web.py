"""What every page needs: who is signed in, the templates, forms with their CSRF check,
and the filters' parsing.

Routes are plain (sync) functions run in the threadpool, as the API's are. A request
without a valid session is sent to the sign-in page; a POST without the session's CSRF
token is refused with 403 before the route runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode
from uuid import UUID

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from jinja2 import Environment, PackageLoader, StrictUndefined
from sqlalchemy import Connection, Engine

from postrelay.core.errors import ValidationError
from postrelay.dashboard import filters, queries
from postrelay.dashboard.session import SESSION_COOKIE, Session, Signer
from postrelay.queue import tenant_list

SERVICE_ACTOR = "dashboard:service-role"
NUL_RULE = "must not contain NUL characters (the database cannot store them)"
MAX_FORM_BYTES = 1_000_000
FIELD_LIMIT = 2_000  # ids checked on the DLQ page, at most


class SignInRequired(Exception):
    """No valid session: pages redirect to the sign-in page, fragments answer 401."""


class Forbidden(Exception):
    """A POST without the right CSRF token, or from another site."""


@dataclass(frozen=True, slots=True)
class User:
    """The signed-in browser. `tenant_id` None: the service role (every tenant)."""

    actor: str  # written to audit rows: dashboard:service-role, dashboard:key:<name>
    tenant_id: UUID | None
    tenant_name: str | None
    key_name: str | None
    session: Session
    csrf: str

    @property
    def is_service_role(self) -> bool:
        return self.tenant_id is None


def tenant_names(conn: Connection, user: User) -> dict[UUID, str]:
    """Names to show for tenant ids: every tenant's for the service role, else its own."""
    if user.tenant_id is not None:
        return {user.tenant_id: user.tenant_name or str(user.tenant_id)}
    return {t.id: t.name for t in tenant_list(conn)}


# Starlette's app.state holds untyped attributes: what create_dashboard put there.
def engine_of(request: Request) -> Engine:
    return request.app.state.engine  # type: ignore[no-any-return]  # untyped app.state


def signer_of(request: Request) -> Signer:
    return request.app.state.signer  # type: ignore[no-any-return]  # untyped app.state


def current_user(request: Request) -> User:
    signer = signer_of(request)
    session = signer.load(request.cookies.get(SESSION_COOKIE))
    if session is None:
        raise SignInRequired()
    csrf = signer.csrf_token(session.nonce)
    if session.key_id is None:
        return User(SERVICE_ACTOR, None, None, None, session, csrf)
    # A tenant session is only as good as its key: re-checked on every request, so a
    # revoked key signs the browser out at once.
    with engine_of(request).connect() as conn:
        key = queries.api_key_active(conn, session.key_id)
    if key is None or key.tenant_id != session.tenant_id:
        raise SignInRequired()
    return User(f"dashboard:key:{key.name}", key.tenant_id, key.tenant_name, key.name,
                session, csrf)


CurrentUser = Annotated[User, Depends(current_user)]
Db = Annotated[Engine, Depends(engine_of)]


async def read_form(request: Request) -> dict[str, list[str]]:
    """An urlencoded form body. (python-multipart is not a dependency: the dashboard's
    forms are all urlencoded, which the standard library parses.)"""
    body = await request.body()
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if body and kind != "application/x-www-form-urlencoded":
        raise Forbidden("forms must be sent urlencoded")
    if len(body) > MAX_FORM_BYTES:
        raise Forbidden("form too large")
    try:
        form = parse_qs(body.decode("utf-8"), keep_blank_values=True,
                        max_num_fields=FIELD_LIMIT + 50)
    except (UnicodeDecodeError, ValueError):
        raise Forbidden("malformed form") from None
    for name, values in form.items():
        _refuse_nul(name, values)
    return form


def no_nul_in_query(request: Request) -> None:
    """Every dashboard route's first dependency: a query parameter holding NUL, which
    PostgreSQL refuses in text (a filter would fail as a 500), is a 400 naming it. Forms are
    checked the same way by read_form. Checked before the route runs, so a new page or a
    new filter cannot forget it."""
    for name, value in request.query_params.multi_items():
        _refuse_nul(name, [value])


def _refuse_nul(name: str, values: list[str]) -> None:
    if "\x00" in name:
        raise ValidationError(name.replace("\x00", "\\x00"), NUL_RULE)
    if any("\x00" in value for value in values):
        raise ValidationError(name, NUL_RULE)


async def posted_form(request: Request, user: CurrentUser) -> dict[str, list[str]]:
    """The form of a mutating request, after the CSRF check. SameSite=Strict already keeps
    the cookie off cross-site requests; the token makes a forged form fail regardless."""
    if request.headers.get("sec-fetch-site") == "cross-site":
        raise Forbidden("cross-site request")
    form = await read_form(request)
    if not signer_of(request).csrf_ok(user.session.nonce, first(form, "csrf")):
        raise Forbidden("the form's security token is missing or stale: reload the page")
    return form


Form = Annotated[dict[str, list[str]], Depends(posted_form)]


def first(form: dict[str, list[str]], name: str) -> str | None:
    values = form.get(name)
    return values[0] if values else None


def render(request: Request, template: str, context: dict[str, Any], *,
           user: User | None = None, status: int = 200) -> HTMLResponse:
    env: Environment = request.app.state.templates
    page = env.get_template(template).render(
        request=request, user=user, csrf=user.csrf if user else "", root=request.scope.get(
            "root_path", ""), now=datetime.now(UTC), **context)
    return HTMLResponse(page, status_code=status)


def redirect(request: Request, path: str, **params: Any) -> RedirectResponse:
    """303 to a dashboard path (after a POST: the browser follows with a GET)."""
    query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
    url = request.scope.get("root_path", "") + path + (f"?{query}" if query else "")
    return RedirectResponse(url, status_code=303)


def redirect_with_notice(request: Request, path: str, notice: str,
                         **params: Any) -> RedirectResponse:
    """`redirect` (with `params`), carrying a notice of what was done for the page to show.
    It is signed: the link is anyone's to write, and the dashboard must not say what it
    did not do."""
    return redirect(request, path, **params, notice=notice,
                    sig=signer_of(request).notice_mac(notice))


def notice_of(request: Request, notice: str, sig: str) -> str | None:
    """The notice a redirect_with_notice link carries; None when there is none, or it is
    not one the dashboard signed."""
    return notice if notice and signer_of(request).notice_ok(notice, sig) else None


def templates_environment() -> Environment:
    """Jinja2 with autoescape on for every template: payloads, error texts and email
    fields are untrusted, and every value is escaped unless a template says otherwise
    (none does). Every printed value also goes through `filters.finalize`: bidi controls
    made visible and inert, right-to-left values isolated in <bdi>."""
    env = Environment(loader=PackageLoader("postrelay.dashboard", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                      finalize=filters.finalize)
    env.filters.update(filters.FILTERS)
    env.globals.update(filters.GLOBALS)
    return env


def optional_uuid(name: str, value: str | None) -> UUID | None:
    if value is None or not value.strip():
        return None
    try:
        return UUID(value.strip())
    except ValueError:
        raise ValidationError(name, f"must be a UUID, got {value!r}") from None


def optional_time(name: str, value: str | None) -> datetime | None:
    """A time from a datetime-local field or an ISO 8601 string; UTC unless it says."""
    if value is None or not value.strip():
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValidationError(name, f"must be a date and time, got {value!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def page_number(value: str | None) -> int:
    """A listing's page, 1 to queries.MAX_PAGE; junk or a page outside is the nearest."""
    try:
        page = int(value or 1)
    except ValueError:
        page = 1
    return min(max(page, 1), queries.MAX_PAGE)


def scope(user: User, requested: UUID | None) -> UUID | None:
    """The tenant a read is limited to: a tenant session's own, whatever was asked."""
    return user.tenant_id if user.tenant_id is not None else requested


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
