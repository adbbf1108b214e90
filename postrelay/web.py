"""The application `postrelay api` serves: the HTTP admin API with the dashboard mounted at
`/dashboard`, in one process. The one module that knows both: the API and the dashboard do
not import each other (see docs/architecture.md).

    app = create_web_app(settings, open_database(settings))
    uvicorn.run(app, port=8000)
"""

from __future__ import annotations

from fastapi import FastAPI

from postrelay.api import create_app
from postrelay.core.db import Database
from postrelay.core.settings import Settings
from postrelay.dashboard import create_dashboard


def create_web_app(settings: Settings, db: Database) -> FastAPI:
    """The API (`postrelay.api.create_app`) with the dashboard mounted at `/dashboard`. They
    share one bound on failed authentication: they check the same keys. Raises ConfigError,
    like both, when no service-role key is configured or a short one."""
    app = create_app(settings, db)
    app.mount("/dashboard", create_dashboard(settings, db, throttle=app.state.auth_throttle))
    return app
