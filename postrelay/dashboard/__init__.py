"""The web dashboard: the queue, the DLQ, cron, the outbox and the email log at a glance.

Server-rendered (Jinja2) from the API's process and mounted at `/dashboard` by
`postrelay.web.create_web_app`; its CSS and JavaScript are files of this package (no CDN, no
build step). See docs/dashboard.md.

    app.mount("/dashboard", create_dashboard(settings, db))
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what __getattr__ returns, for a type checker
    from postrelay.dashboard.app import create_dashboard

__all__ = ["create_dashboard"]


def __getattr__(name: str) -> Any:
    # Lazy, like postrelay.api: the submodules import each other through this package.
    if name == "create_dashboard":
        from postrelay.dashboard.app import create_dashboard

        return create_dashboard
    raise AttributeError(name)
