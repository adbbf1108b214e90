"""Every error as `{"data": null, "error": {"code", "message"}}` with the right status.

400 bad input (the field named), 401 no or wrong key, 403 refused by a rule of what the
caller may do (`kind_reserved`, `name_reserved`), 404 not found, 409 conflict, 413 a payload
or a request body over POSTRELAY_MAX_PAYLOAD_BYTES, 415 a compressed body
(Content-Encoding), 429 too many failed authentication
attempts (with Retry-After), 503 a database that is unreachable or not migrated. Bad input
must never surface as a 500: validation errors from FastAPI and from postrelay's own
checks both land here, and a database DataError (a value the database refused) is a 400 too.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, InterfaceError, OperationalError, ProgrammingError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from postrelay.access import API_FIELD_NAMES
from postrelay.api.bodies import RepeatedKeyError
from postrelay.core.db import SCHEMA_MISSING
from postrelay.core.errors import (
    ConflictError,
    ForbiddenError,
    NotFoundError,
    PayloadTooLargeError,
    ValidationError,
)
from postrelay.core.limits import DEPTH_RULE
from postrelay.core.telemetry import event

JSON_RULE = "must be a JSON object in UTF-8, sent as Content-Type: application/json"
# The rules postrelay's checks state name other fields in Python's spelling ("give at least
# one of kind, tenant_id, ..."), which a body that sent `tenant_id` would have refused as
# unknown. Only the snake_case names: `delay` is an English word as well.
_API_NAMES_IN_RULE = re.compile(
    r"\b(?:" + "|".join(re.escape(name) for name in API_FIELD_NAMES if "_" in name) + r")\b")

RETRY_AFTER_SECS = 5

CODES = {400: "invalid_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
         405: "method_not_allowed", 409: "conflict", 413: "payload_too_large",
         415: "unsupported_media_type", 429: "too_many_requests",
         503: "not_ready"}


class ApiError(Exception):
    """Raised by endpoints and dependencies for an error answer."""

    def __init__(self, status: int, message: str, *, code: str | None = None,
                 field: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code or CODES.get(status, "error")
        self.message = message
        self.field = field
        self.headers = headers


def error_response(status: int, code: str, message: str, *, field: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    error: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        error["field"] = field
    return JSONResponse({"data": None, "error": error}, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Map every exception an endpoint can raise to the error envelope."""

    @app.exception_handler(ApiError)
    def _api(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, field=exc.field,
                              headers=exc.headers)

    @app.exception_handler(ValidationError)
    def _validation(request: Request, exc: ValidationError) -> JSONResponse:
        field = API_FIELD_NAMES.get(exc.field, exc.field)
        status = 413 if isinstance(exc, PayloadTooLargeError) else 400
        rule = _API_NAMES_IN_RULE.sub(lambda m: API_FIELD_NAMES[m.group(0)], exc.rule)
        return error_response(status, CODES[status], f"{field}: {rule}", field=field)

    @app.exception_handler(RequestValidationError)
    def _request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        content_type = request.headers.get("content-type")
        problems = [_describe(err, content_type) for err in exc.errors()]
        message = "; ".join(f"{field}: {msg}" for field, msg in problems)
        return error_response(400, CODES[400], message, field=problems[0][0] if problems else None)

    @app.exception_handler(ForbiddenError)
    def _forbidden(request: Request, exc: ForbiddenError) -> JSONResponse:
        return error_response(403, exc.code, exc.message)

    @app.exception_handler(NotFoundError)
    def _not_found(request: Request, exc: NotFoundError) -> JSONResponse:
        return error_response(404, CODES[404], str(exc))

    @app.exception_handler(ConflictError)
    def _conflict(request: Request, exc: ConflictError) -> JSONResponse:
        return error_response(409, CODES[409], str(exc))

    @app.exception_handler(DataError)
    def _data(request: Request, exc: DataError) -> JSONResponse:
        # The database refused a value that passed our checks (a range we did not foresee).
        detail = str(exc.orig).splitlines()[0] if exc.orig is not None else "invalid value"
        return error_response(400, CODES[400], f"invalid value: {detail}")

    @app.exception_handler(StarletteHTTPException)
    def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, RecursionError):  # FastAPI's JSON parse gave out
            return error_response(400, CODES[400], f"body: {DEPTH_RULE}", field="body")
        if isinstance(exc.__cause__, UnicodeDecodeError):  # bytes that are no JSON encoding
            return error_response(400, CODES[400], f"body: {JSON_RULE}", field="body")
        if isinstance(exc.__cause__, RepeatedKeyError):  # bodies.py: a key given twice
            return error_response(400, CODES[400], str(exc.__cause__),
                                  field=exc.__cause__.field)
        code = CODES.get(exc.status_code, "error")
        return error_response(exc.status_code, code, str(exc.detail),
                              headers=getattr(exc, "headers", None))

    # The database down, restarting or too slow (or the pool exhausted), or behind the
    # code's migrations: a 503 that says which, logged as one line. The catch-all below
    # answered 500 "internal error" and Starlette logged a traceback for each request; a
    # tenant key, which is looked up in the database, met it even on /metrics. The driver's
    # words (the database's address, the missing table) go to the log only.
    def _database_down(request: Request, exc: Exception) -> JSONResponse:
        event("postrelay.api.database_unavailable", logging.WARNING,
              path=request.url.path, error=_first_line(exc))
        return error_response(503, CODES[503], "database unavailable: it cannot be reached "
                              "or did not answer in time; try again shortly (the server log "
                              "says why)", headers={"Retry-After": str(RETRY_AFTER_SECS)})

    for unavailable in (OperationalError, InterfaceError, PoolTimeoutError):
        app.add_exception_handler(unavailable, _database_down)

    @app.exception_handler(ProgrammingError)
    def _not_migrated(request: Request, exc: ProgrammingError) -> JSONResponse:
        if not isinstance(exc.orig, SCHEMA_MISSING):
            raise exc  # a bug, not the schema: the 500 below, with its traceback
        event("postrelay.api.database_not_migrated", logging.WARNING,
              path=request.url.path, error=_first_line(exc))
        return error_response(503, CODES[503], "database not migrated: a table or column "
                              "this version reads is missing; run `postrelay migrate` (the "
                              "server log says which)")

    @app.exception_handler(Exception)
    def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        event("postrelay.api.error", logging.ERROR, path=request.url.path, error=repr(exc))
        return error_response(500, "internal_error", "internal error (see the server log)")


def _first_line(exc: Exception) -> str:
    return str(getattr(exc, "orig", None) or exc).splitlines()[0]


def _describe(err: Any, content_type: str | None) -> tuple[str, str]:
    """(field, message) of one pydantic error; the field as the client spelled it."""
    loc = [str(part) for part in err.get("loc", ())]
    where = loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc
    if err.get("type") == "json_invalid":
        return "body", "not valid JSON"
    if loc == ["body"] and err.get("type") == "model_attributes_type":
        # FastAPI reads a body as JSON only when its Content-Type says so; any other body
        # reaches the model as bytes, which pydantic calls "not a valid dictionary".
        if not _is_json(content_type):
            return "body", f"{JSON_RULE}, got Content-Type {content_type or '(none)'}"
        return "body", "must be a JSON object"
    field = ".".join(where) or (loc[0] if loc else "request")
    raised = (err.get("ctx") or {}).get("error")
    if err.get("type") == "value_error" and raised is not None:
        return field, str(raised)  # our validators' own words, without pydantic's "Value error, "
    return field, str(err.get("msg", "invalid"))


def _is_json(content_type: str | None) -> bool:
    """Whether FastAPI parses a body of this Content-Type as JSON (application/json or
    application/*+json)."""
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                           and media.endswith("+json"))
