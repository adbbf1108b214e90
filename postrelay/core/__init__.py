"""Shared foundations: settings, database access, SQL loading, errors, telemetry.

Nothing here imports anything else from postrelay.
"""

from postrelay.core.errors import ConfigError, NotFoundError, PostrelayError, ValidationError
from postrelay.core.settings import Settings

__all__ = ["ConfigError", "NotFoundError", "PostrelayError", "Settings", "ValidationError"]
