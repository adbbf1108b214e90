"""The root `postrelay` command, which every command module adds its commands to. Its own
module so that the command modules need not import `main`, which imports them."""

import typer

from postrelay.cli.boundary import GuardedGroup

# GuardedGroup: whatever a command raises ends as one line on stderr and an exit code.
app = typer.Typer(help="postrelay: outbox relay, email orchestrator and job queue on PostgreSQL.",
                  no_args_is_help=True, add_completion=False, cls=GuardedGroup)
