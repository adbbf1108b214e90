"""The root `postrelay` command, which every command module adds its commands to. Its own
module so that the command modules need not import `main`, which imports them."""

import typer

app = typer.Typer(help="postrelay: outbox relay, email orchestrator and job queue on PostgreSQL.",
                  no_args_is_help=True, add_completion=False)
