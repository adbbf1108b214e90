"""The `postrelay` command line. Each command group lives in its own module."""

from postrelay.cli.main import app

__all__ = ["app"]
