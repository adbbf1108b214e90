"""The API's application factory: `create_app(settings, db)` (the dashboard is mounted beside
it by `postrelay.web.create_web_app`). No module-level settings or engines:
every app gets its own engine, key and metrics registry, so tests can build several."""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi

import postrelay
from postrelay.access import auth_throttle, service_role_key
from postrelay.api.bodylimit import BODY_ROOM, FEEDBACK_BODY_BYTES, BodyLimit
from postrelay.api.common import errors, query_checked
from postrelay.api.errors import install_error_handlers
from postrelay.api.metrics import metrics_registry
from postrelay.api.routers import (
    cancel,
    cron,
    dlq,
    feedback,
    health,
    jobs,
    limits,
    metrics,
    outbox,
    pauses,
    unsubscribe,
    webhooks,
)
from postrelay.core.db import Database
from postrelay.core.migrate import head_revision, scripts
from postrelay.core.settings import Settings
from postrelay.orchestrator import ProviderWebhooks, UnsubscribeLinks

DESCRIPTION = """postrelay's admin API: jobs, the dead-letter queue, cron entries, flow
control, the outbox and webhook endpoints.

Send the service-role key (or a tenant key) as the `apikey` header or as
`Authorization: Bearer <key>`. Every answer is `{"data": ..., "meta": ...}`; every error is
`{"data": null, "error": {"code": ..., "message": ...}}`."""


def create_app(settings: Settings, db: Database) -> FastAPI:
    """Build the API on `db`. Raises ConfigError when no service-role key is configured, or
    a short one: the API refuses to run open.

        settings = load_settings()
        app = create_app(settings, open_database(settings))
        uvicorn.run(app, port=8000)
    """
    key = service_role_key(settings)
    app = FastAPI(title="postrelay", version=postrelay.__version__, description=DESCRIPTION)
    # Sync endpoints run in the threadpool; a short connect timeout keeps /readyz honest
    # when the database is unreachable.
    engine = db.sync_engine(connect_args={"connect_timeout": 5})
    app.state.settings = settings
    app.state.engine = engine
    app.state.service_role_key = key
    # One bound on failed authentication for the API and the dashboard's sign-in.
    app.state.auth_throttle = auth_throttle(settings)
    app.state.head_revision = head_revision()
    # /readyz tells a database behind these from one a newer postrelay migrated.
    app.state.known_revisions = frozenset(r.revision for r in scripts().walk_revisions())
    app.state.metrics_registry = metrics_registry(
        engine, max_tenants=settings.metrics_max_tenants)
    app.state.provider_webhooks = ProviderWebhooks.from_settings(settings)
    # Made once: a bad POSTRELAY_PUBLIC_URL stops the API at start, not each /u/ request.
    app.state.unsubscribe_links = UnsubscribeLinks.from_settings(settings)
    install_error_handlers(app)
    # dlq before jobs: `/jobs/dlq` must match the DLQ route, not `/jobs/{id}`.
    for module in (health, metrics, dlq, cancel, jobs, cron, outbox, pauses, limits,
                   webhooks, unsubscribe, feedback):
        # The admin resources refuse a query parameter they do not take; health, metrics
        # and the links and webhooks others call are left to whatever their callers add.
        checked = module in (dlq, cancel, jobs, cron, outbox, pauses, limits, webhooks)
        app.include_router(module.router,
                           dependencies=[Depends(query_checked)] if checked else None,
                           responses=errors(400) if checked else None)
    # Outermost, also for the dashboard mounted beside (postrelay/web.py): a body over the
    # limit is refused before any endpoint or form parser reads it.
    # SendGrid posts batches of up to 768 KB, whatever the payload limit.
    app.add_middleware(BodyLimit, limit=settings.max_payload_bytes + BODY_ROOM,
                       wider={feedback.PREFIX + "/": FEEDBACK_BODY_BYTES})
    # FastAPI's documented way to replace the schema is to assign the method.
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema without its 422 answers: this API answers bad input with 400."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version,
                             description=app.description, routes=app.routes)
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        components = schema.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema
