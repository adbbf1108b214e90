"""`postrelay email preview`: render a template with a context, without sending."""

from __future__ import annotations

import enum
import uuid
from pathlib import Path
from typing import Any

import typer

from postrelay.cli.boundary import GuardedGroup
from postrelay.cli.common import settings_or_exit, user_errors
from postrelay.cli.root import app
from postrelay.core import jsontext
from postrelay.core.errors import ValidationError
from postrelay.orchestrator import (
    Rendered,
    Templates,
    build_message,
    message_id_domain,
    message_id_for,
    parse_address,
)

email_app = typer.Typer(help="Email templates: preview what a message will look like.",
                        no_args_is_help=True,
                        cls=GuardedGroup)
app.add_typer(email_app, name="email")

# The preview's Message-ID names no real job: <00000000-0000-0000-0000-000000000000@domain>.
PREVIEW_JOB_ID = uuid.UUID(int=0)
DEFAULT_FROM = "postrelay <postrelay@localhost>"
DEFAULT_TO = "Preview Recipient <recipient@example.com>"


class Format(enum.StrEnum):
    text = "text"
    html = "html"
    raw = "raw"


@email_app.command("preview")
def preview(
    template: str = typer.Argument(..., help="The template's folder name."),
    context: Path | None = typer.Option(None, "--context", help="JSON object file of variables."),
    tenant: list[str] = typer.Option([], "--tenant",
                                     help="Tenant override folder; repeat in order of preference."),
    templates: Path | None = typer.Option(None, "--templates", help="Templates folder.",
                                          show_default="POSTRELAY_EMAIL_TEMPLATES_DIR"),
    fmt: Format = typer.Option(Format.text, "--format",
                               help="text: subject and text body; html: the HTML body only; "
                                    "raw: the whole MIME message."),
    # show_default, not "[default: ...]" in the help: typer reads help as Rich markup, in
    # which that is a style tag, and printed "From of the message ." (test_cli_help.py).
    sender: str | None = typer.Option(None, "--from",
                                      help="From of the message (--format raw prints it).",
                                      show_default="POSTRELAY_EMAIL_FROM"),
    to: list[str] = typer.Option([], "--to", help="To of the message (repeatable).",
                                 show_default=DEFAULT_TO),
) -> None:
    """Render TEMPLATE with a context and print it; nothing is sent."""
    settings = settings_or_exit()
    with user_errors():
        rendered = Templates(templates or settings.email_templates_dir).render(
            template, _load_context(context), tenant_keys=tenant)
        # Built whatever the format: a subject that no message can carry (a line break in
        # it) fails the send, so the preview must fail too, not print it as if it were fine.
        from_address = parse_address(sender or settings.email_from or DEFAULT_FROM,
                                     field="from")
        domain = message_id_domain(settings.email_message_id_domain, from_address)
        message = build_message(
            rendered=rendered, sender=from_address,
            to=[parse_address(value, field=f"to[{i}]")
                for i, value in enumerate(to or [DEFAULT_TO])],
            message_id=message_id_for(PREVIEW_JOB_ID, domain))
        if fmt is Format.raw:
            typer.echo(message.as_bytes(), nl=False)
        elif fmt is Format.html:
            if rendered.html is None:
                raise ValidationError("format", f"template {template!r} has no body.html")
            typer.echo(rendered.html)
        else:
            typer.echo(_text_view(rendered))


def _load_context(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = jsontext.parse_document(path.read_text(encoding="utf-8"), "context")
    except OSError as exc:
        raise ValidationError("context", f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ValidationError("context", f"{path} is not valid JSON: {exc}") from None
    except ValidationError as exc:
        raise ValidationError("context", f"{path}: {exc.rule}") from None
    if not isinstance(data, dict):
        raise ValidationError("context", f"{path} must hold a JSON object, not "
                                         f"{type(data).__name__}")
    return data


def _text_view(rendered: Rendered) -> str:
    html = "yes (--format html prints it)" if rendered.html is not None else "no"
    return (f"Template: {rendered.template} (version {rendered.version}, "
            f"on_unknown={rendered.on_unknown})\n"
            f"Subject: {rendered.subject}\n"
            f"HTML: {html}\n\n"
            f"{rendered.text}")
