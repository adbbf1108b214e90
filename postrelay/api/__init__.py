"""The HTTP admin API: `create_app(settings, db)` builds it, `postrelay api` serves it.

One router per resource (jobs, dlq, cron, health, metrics); every answer is
`{"data": ..., "meta": ...}` and every error `{"data": null, "error": {"code", "message"}}`.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what __getattr__ returns, for a type checker
    from postrelay.api.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    # Lazy: migrations/env.py imports postrelay.access.schema, and `postrelay migrate` should not
    # pay for importing FastAPI.
    if name == "create_app":
        from postrelay.api.app import create_app

        return create_app
    raise AttributeError(name)
