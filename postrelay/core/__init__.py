"""Shared foundations: settings, database access, SQL loading, errors, telemetry.

Nothing here imports anything else from postrelay.
"""

from postrelay.core.errors import (
    ConfigError,
    ConflictError,
    NotFoundError,
    PostrelayError,
    ValidationError,
)
from postrelay.core.settings import Settings

__all__ = [
    "ConfigError",
    "ConflictError",
    "NotFoundError",
    "PostrelayError",
    "Settings",
    "ValidationError",
]
