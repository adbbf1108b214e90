"""`/metrics` in the Prometheus text format. It shows every tenant's numbers, so it needs
the service-role key (Prometheus sends it with `authorization: {credentials: ...}`)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from postrelay.api.auth import ServiceRole
from postrelay.api.common import errors

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"description": "Prometheus text format.",
                     "content": {"text/plain": {"schema": {"type": "string"}}}},
               **errors(401, 403)},
)
def metrics(request: Request, caller: ServiceRole) -> Response:
    """Jobs by status and kind, due backlog and its age, DLQ size, the outbox, feedback,
    and each collector's health; read at scrape time."""
    body = generate_latest(request.app.state.metrics_registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
