"""The `postrelay` command: the root (cli/root.py) with every command group registered."""

# Imported for their side effect of adding commands to the root.
from postrelay.cli import (  # noqa: F401
    admin,
    api,
    cron,
    email,
    emails,
    feedback,
    flow,
    relay,
    schema,
    webhooks,
    worker,
)
from postrelay.cli.root import app

__all__ = ["app"]
