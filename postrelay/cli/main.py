"""The root `postrelay` command; groups register themselves from their modules."""

import typer

from postrelay.cli.boundary import GuardedGroup

# GuardedGroup: whatever a command raises ends as one line on stderr and an exit code.
app = typer.Typer(help="postrelay: outbox relay, email orchestrator and job queue on PostgreSQL.",
                  no_args_is_help=True, add_completion=False, cls=GuardedGroup)


def _register() -> None:
    # Imported for their side effect of adding commands to `app`.
    from postrelay.cli import (  # noqa: F401
        admin,
        api,
        cron,
        email,
        emails,
        feedback,
        relay,
        schema,
        webhooks,
        worker,
    )


_register()
