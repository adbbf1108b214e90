"""`/healthz` (the process is up) and `/readyz` (database reachable, migrations at head),
for orchestrators. Both are unauthenticated and reveal nothing about jobs."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError

from postrelay.api.common import Db, errors
from postrelay.api.errors import error_response
from postrelay.api.models import Envelope, Health, Readiness
from postrelay.core.sqlfiles import load_queries
from postrelay.core.telemetry import event

HEALTH_SQL = load_queries("postrelay.api", "sql/health.sql")

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Envelope[Health])
def healthz() -> Envelope[Health]:
    """The process is up and serving."""
    return Envelope(data=Health())


@router.get("/readyz", response_model=Envelope[Readiness], responses=errors(503))
def readyz(request: Request, engine: Db) -> Envelope[Readiness] | JSONResponse:
    """The database answers and is migrated to the revision this code expects, or to a
    later one a newer postrelay made."""
    head: str | None = request.app.state.head_revision
    try:
        with engine.connect() as conn:
            revision = conn.execute(HEALTH_SQL["migration_revision"]).scalar()
    except SQLAlchemyError as exc:
        # Unreachable, or not migrated at all (no version table): either way, not ready.
        # The driver's words name the database's host, port and user (and whether its
        # password was refused): the log's, not an answer to anyone without a key.
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        event("postrelay.api.not_ready", logging.WARNING, reason=reason)
        return error_response(503, "not_ready", "database not ready: it cannot be reached "
                                                "or read (the server log says why)")
    if revision is not None and revision not in request.app.state.known_revisions:
        # A newer postrelay migrated it: a release rolled back. The worker, the relay and
        # inbound run on such a schema (postrelay.migrate.schema_ahead), and `postrelay
        # migrate` refuses it, so 503 here would only take every API replica out at once.
        return Envelope(data=Readiness(revision=revision, head=head))
    if revision != head:
        return error_response(
            503, "not_ready",
            f"database at migration {revision}, this code needs {head}: run `postrelay migrate`",
        )
    return Envelope(data=Readiness(revision=revision, head=head))
