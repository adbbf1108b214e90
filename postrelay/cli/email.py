"""`postrelay email preview`: render a template with a context, without sending."""

from __future__ import annotations

import typer

from postrelay.cli.main import app

email_app = typer.Typer(help="Email templates: preview what a message will look like.",
                        no_args_is_help=True)
app.add_typer(email_app, name="email")
