"""`postrelay emails [list|show ID]`: the email log, and one message's whole story."""

from __future__ import annotations

import typer

from postrelay.cli.main import app

emails_app = typer.Typer(help="The email log: every message attempt and its outcome.",
                         no_args_is_help=True)
app.add_typer(emails_app, name="emails")
