"""The dashboard's application: mounted at `/dashboard` beside the API by `postrelay.web`,
served by the same process. Server-rendered pages (Jinja2), one CSS and one JavaScript file
shipped in the package, no CDN and no build step."""

from __future__ import annotations

import logging
from collections.abc import Callable
from urllib.parse import quote

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import InterfaceError, OperationalError, ProgrammingError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from postrelay.access import AuthThrottle, auth_throttle, service_role_key
from postrelay.core.db import SCHEMA_MISSING, Database
from postrelay.core.errors import (
    ConflictError,
    ForbiddenError,
    NotFoundError,
    ValidationError,
)
from postrelay.core.settings import Settings
from postrelay.core.telemetry import event
from postrelay.dashboard.routes import auth, cron, dlq, emails, jobs, outbox, overview, pauses
from postrelay.dashboard.security import SecurityHeaders
from postrelay.dashboard.session import SESSION_COOKIE, Signer
from postrelay.dashboard.web import (
    Forbidden,
    SignInRequired,
    current_user,
    no_nul_in_query,
    render,
    templates_environment,
)
from postrelay.orchestrator import Templates

FRAGMENT_HEADER = "x-dashboard-fragment"
DATABASE_DOWN = ("The database cannot be reached, or did not answer in time. Try again in "
                 "a moment; the details are in the server's log.")
RETRY_AFTER_SECS = 5
NOT_MIGRATED = ("The database's schema is behind this version of postrelay: a table or "
                "column it reads is missing. Run `postrelay migrate`; the details are in the "
                "server's log.")


def create_dashboard(settings: Settings, db: Database, *,
                     throttle: AuthThrottle | None = None) -> FastAPI:
    """The dashboard as an ASGI app to mount (`app.mount("/dashboard", ...)`).

    It has its own small connection pool, with custom plans forced: its statements filter
    on optional parameters (`:tenant_id IS NULL OR …`), which only a plan made for the real
    values turns into index scans. JIT is off: compiling costs more than these short
    statements run. `throttle` bounds failed sign-ins; the API passes its own, so that the
    API and the sign-in form share one bound.
    """
    key = service_role_key(settings)  # ConfigError: unset, or too short
    app = FastAPI(title="postrelay dashboard", docs_url=None, redoc_url=None,
                  openapi_url=None, dependencies=[Depends(no_nul_in_query)])
    app.state.settings = settings
    options = "-c plan_cache_mode=force_custom_plan -c jit=off"
    app.state.engine = db.sync_engine(
        pool_size=4, max_overflow=4, connect_args={"connect_timeout": 5, "options": options})
    app.state.service_role_key = key
    app.state.auth_throttle = throttle or auth_throttle(settings)
    app.state.signer = Signer(app.state.service_role_key)
    app.state.templates = templates_environment()
    app.state.email_templates = Templates(settings.email_templates_dir)
    app.add_middleware(UnexpectedErrors)
    app.add_middleware(SecurityHeaders)  # added last: outermost, so error pages get them too
    _install_error_pages(app)
    for module in (auth, overview, jobs, dlq, cron, pauses, outbox, emails):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(packages=[("postrelay.dashboard", "static")]),
              name="static")
    return app


def _install_error_pages(app: FastAPI) -> None:
    @app.exception_handler(SignInRequired)
    def _sign_in(request: Request, exc: SignInRequired) -> Response:
        root = request.scope.get("root_path", "")
        if request.headers.get(FRAGMENT_HEADER):
            response: Response = Response(status_code=401)  # the script goes to sign-in
        else:
            here = request.url.path.removeprefix(root) or "/"
            if request.url.query:
                here += "?" + request.url.query
            target = root + "/login" + ("" if here == "/" else "?next=" + quote(here, safe=""))
            response = RedirectResponse(target, status_code=303)
        if SESSION_COOKIE in request.cookies:  # expired, forged or its key revoked
            response.delete_cookie(SESSION_COOKIE, path=root or "/")
        return response

    # postrelay's own errors: one page each, with the exception's message.
    for error, status, title in ((Forbidden, 403, "Refused"),
                                 (ForbiddenError, 403, "Refused"),
                                 (ValidationError, 400, "Bad request"),
                                 (NotFoundError, 404, "Not found"),
                                 (ConflictError, 409, "Conflict")):
        app.add_exception_handler(error, _error_page_for(status, title))

    @app.exception_handler(RequestValidationError)
    def _bad_parameter(request: Request, exc: RequestValidationError) -> HTMLResponse:
        # A query parameter of the wrong type (`/dlq?n=x`): the field named, as for ours.
        problems = []
        for err in exc.errors():
            loc = [str(part) for part in err.get("loc", ()) if part not in ("query", "path")]
            problems.append(f"{'.'.join(loc) or 'request'}: {err.get('msg', 'invalid')}")
        return _error_page(request, 400, "Bad request", "; ".join(problems))

    @app.exception_handler(StarletteHTTPException)
    def _http(request: Request, exc: StarletteHTTPException) -> HTMLResponse:
        title = "Not found" if exc.status_code == 404 else "Error"
        return _error_page(request, exc.status_code, title, str(exc.detail))

    # The database down, restarting, or too slow for its timeouts (or the pool exhausted):
    # a 503 that says so, logged as one line, not a 500 and a traceback. The page is made
    # without asking the database who is signed in: that would wait for it a second time.
    def _database_down(request: Request, exc: Exception) -> HTMLResponse:
        event("postrelay.dashboard.database_unavailable", logging.WARNING,
              path=request.url.path, error=_first_line(exc))
        return _unavailable(request, "Database unavailable", DATABASE_DOWN)

    for unavailable in (OperationalError, InterfaceError, PoolTimeoutError):
        app.add_exception_handler(unavailable, _database_down)

    # The code upgraded and restarted before `postrelay migrate` ran: every page failed as
    # a 500. Said as the CLI says it. Any other ProgrammingError is a bug: the 500 page.
    @app.exception_handler(ProgrammingError)
    def _not_migrated(request: Request, exc: Exception) -> HTMLResponse:
        if not isinstance(getattr(exc, "orig", None), SCHEMA_MISSING):
            raise exc
        event("postrelay.dashboard.database_not_migrated", logging.WARNING,
              path=request.url.path, error=_first_line(exc))
        return _unavailable(request, "Database not migrated", NOT_MIGRATED)


class UnexpectedErrors:
    """The 500 page for an exception no handler took, logged once, with its traceback.

    Not an exception handler for Exception: Starlette runs that one in its outermost
    middleware, which answers and then re-raises — into the API app the dashboard is
    mounted in, which logged the error a second time as its own, and on to uvicorn, which
    logged it a third time and closed the connection (a proxy reusing it got an error for
    the next request). Its page also went out without the security headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            if started:  # too late for a page: the server ends the response
                raise
            request = Request(scope, receive)
            # With its traceback: no one else logs this error now.
            event("postrelay.dashboard.error", logging.ERROR, path=request.url.path,
                  error=repr(exc), exc_info=exc)
            response = await run_in_threadpool(
                _error_page, request, 500, "Something went wrong",
                "The error is in the server's log.")
            await response(scope, receive, send)


def _error_page_for(status: int, title: str) -> Callable[[Request, Exception], HTMLResponse]:
    def handler(request: Request, exc: Exception) -> HTMLResponse:
        return _error_page(request, status, title, str(exc))

    return handler


def _error_page(request: Request, status: int, title: str, message: str) -> HTMLResponse:
    try:  # inside the dashboard's frame when signed in, else on its own
        user = current_user(request)
    except Exception:  # no session, or the database is the problem
        user = None
    return render(request, "error.html", {"status": status, "title": title,
                                          "message": message}, user=user, status=status)


def _unavailable(request: Request, title: str, message: str) -> HTMLResponse:
    """A 503 page: the database, not the request, is what failed; try again shortly."""
    response = render(request, "error.html", {"status": 503, "title": title,
                                              "message": message}, status=503)
    response.headers["Retry-After"] = str(RETRY_AFTER_SECS)
    return response


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
