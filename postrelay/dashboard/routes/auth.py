"""Sign-in with the service-role key or a tenant API key, and sign-out."""

from __future__ import annotations

import hmac
import logging

from fastapi import APIRouter, Request
from fastapi.responses import Response

from postrelay.access import AuthThrottle, key_hash, keys_equal
from postrelay.core.telemetry import event
from postrelay.dashboard import queries
from postrelay.dashboard.session import (
    LOGIN_COOKIE,
    LOGIN_SECS,
    SESSION_COOKIE,
    SESSION_SECS,
)
from postrelay.dashboard.web import (
    CurrentUser,
    Form,
    SignInRequired,
    current_user,
    engine_of,
    first,
    read_form,
    redirect,
    render,
    signer_of,
)

router = APIRouter()

WRONG_KEY = "That key is not valid, or it has been revoked."
STALE_FORM = "The sign-in form had expired. Please paste the key again."
THROTTLED = ("Too many failed sign-in attempts from {who}. For your security, sign-in is "
             "paused: try again in {secs} seconds.")


@router.get("/login")
def login_page(request: Request, next: str = "") -> Response:
    try:
        current_user(request)
    except SignInRequired:
        return _login_form(request, next, None, 200)
    return redirect(request, safe_next(next))  # already signed in


@router.post("/login")
async def login(request: Request) -> Response:
    form = await read_form(request)
    next_path = first(form, "next") or ""
    signer = signer_of(request)
    if not signer.login_ok(request.cookies.get(LOGIN_COOKIE), first(form, "csrf")):
        return _login_form(request, next_path, STALE_FORM, 400)
    key = (first(form, "key") or "").strip()
    if not key:  # nothing to check: refused, and not counted as a guess
        return _login_form(request, next_path, WRONG_KEY, 401)
    throttle: AuthThrottle = request.app.state.auth_throttle
    client = request.client.host if request.client else None
    refusal = throttle.check(client)
    if refusal is not None:  # before the key is looked at: the answer must not tell
        event("postrelay.dashboard.sign_in_throttled", logging.WARNING, client=client)
        response = _login_form(request, next_path, THROTTLED.format(
            secs=refusal.retry_after, who=("this dashboard" if refusal.overall
                                           else "your address")), 429)
        response.headers["Retry-After"] = str(refusal.retry_after)
        return response
    service_key: bytes = request.app.state.service_role_key
    if keys_equal(key, service_key):
        session = signer.new_session(None, None)
        actor = "dashboard:service-role"
    else:
        found = None
        digest = key_hash(key)
        with engine_of(request).connect() as conn:
            row = queries.api_key_by_hash(conn, digest)
        if row is not None and hmac.compare_digest(row.key_hash, digest):
            found = row
        if found is None:
            throttle.failed(client, key)
            event("postrelay.dashboard.sign_in_refused", logging.WARNING, client=client)
            return _login_form(request, next_path, WRONG_KEY, 401)
        session = signer.new_session(found.id, found.tenant_id)
        actor = f"dashboard:key:{found.name}"
    throttle.succeeded(client)
    event("postrelay.dashboard.sign_in", actor=actor)
    response = redirect(request, safe_next(next_path))
    _set_cookie(request, response, SESSION_COOKIE, signer.dump(session), SESSION_SECS)
    response.delete_cookie(LOGIN_COOKIE, path=_cookie_path(request))
    return response


@router.post("/logout")
def logout(request: Request, user: CurrentUser, form: Form) -> Response:
    event("postrelay.dashboard.sign_out", actor=user.actor)
    response = redirect(request, "/login")
    response.delete_cookie(SESSION_COOKIE, path=_cookie_path(request))
    return response


def safe_next(value: str | None) -> str:
    """Where to go after signing in: a dashboard path only, never another site."""
    if (not value or not value.startswith("/") or value.startswith("//") or "\\" in value
            or any(ord(c) < 32 for c in value)):
        return "/"
    return value


def _login_form(request: Request, next_path: str, error: str | None, status: int) -> Response:
    signer = signer_of(request)
    nonce = signer.login_nonce()
    response = render(request, "login.html", {
        "token": signer.csrf_token(nonce), "next": safe_next(next_path), "error": error,
    }, status=status)
    _set_cookie(request, response, LOGIN_COOKIE, nonce, LOGIN_SECS)
    return response


def _cookie_path(request: Request) -> str:
    return request.scope.get("root_path") or "/"


def _set_cookie(request: Request, response: Response, name: str, value: str,
                max_age: int) -> None:
    # Secure whenever the browser came over HTTPS, also through a TLS-terminating proxy
    # (`postrelay api` runs uvicorn without proxy headers). Trusting X-Forwarded-Proto here
    # is safe: a forged header can only make the cookie stricter, never looser.
    https = (request.url.scheme == "https"
             or request.headers.get("x-forwarded-proto", "").lower() == "https")
    response.set_cookie(name, value, max_age=max_age, path=_cookie_path(request),
                        httponly=True, samesite="strict", secure=https)
