"""The command lists of `postrelay --help` and its groups show each command's first
paragraph as written, line breaks included: it has to be one line."""

import inspect
import re
from typing import Any

import typer.main
from rich.text import Text

from postrelay.cli import app


def _commands(group: Any, prefix: str = "postrelay") -> list[tuple[str, Any]]:
    found = []
    for name, command in group.commands.items():
        found.append((f"{prefix} {name}", command))
        if hasattr(command, "commands"):  # a group
            found += _commands(command, f"{prefix} {name}")
    return found


def test_every_command_summary_is_one_line() -> None:
    commands = _commands(typer.main.get_command(app))
    assert len(commands) > 30  # the walk reached the groups' commands too
    broken = [path for path, command in commands
              if "\n" in (command.short_help or (command.help or "").split("\n\n")[0])]
    assert broken == []


def test_no_help_text_is_changed_by_the_help_renderer() -> None:
    """typer renders help as Rich markup: `[default: email_from]` was taken for a style tag
    and dropped ("From of the message ."), and `api:key:NAME` became `api🔑NAME`."""
    changed = []
    for path, command in _commands(typer.main.get_command(app)):
        texts = [("", command.help or "")]
        texts += [(param.name, getattr(param, "help", None) or "") for param in command.params]
        for where, text in texts:
            text = inspect.cleandoc(text)
            if Text.from_markup(text).plain != text:
                changed.append(f"{path} {where}: {text!r}")
    assert changed == []


def test_emails_status_help_names_every_status_it_takes() -> None:
    """It left out `cancelled`, which the command takes and the log holds."""
    from postrelay.orchestrator.admin import LIST_STATUSES

    emails = typer.main.get_command(app).commands["emails"]  # type: ignore[attr-defined]
    [status] = [param for param in emails.params if param.name == "status"]
    named = set(re.findall(r"[a-z-]+", status.help))
    assert set(LIST_STATUSES) - named == set()


def test_every_option_and_argument_of_cron_and_limits_says_what_it_is() -> None:
    """`cron add --priority` and `--max-attempts` and `cron rm NAME` had no help, and
    `limits set --rate` named seconds and minutes though hours (3600/h) are taken too."""
    root = typer.main.get_command(app)
    bare = [f"{path} {param.name}" for path, command in _commands(root)
            if path.split()[1] in ("cron", "limits")
            for param in command.params if not (getattr(param, "help", None) or "").strip()]
    assert bare == []
    rate = next(p for p in root.commands["limits"].commands["set"].params  # type: ignore[attr-defined]
                if p.name == "rate")
    assert "/h" in rate.help
    # `limits list --json` prints the limits alone, the throttles only with --throttled,
    # though the table shows both: its help said only "Print JSON."
    as_json = next(p for p in root.commands["limits"].commands["list"].params  # type: ignore[attr-defined]
                   if p.name == "as_json")
    assert "--throttled" in as_json.help
