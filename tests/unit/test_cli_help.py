"""The command lists of `postrelay --help` and its groups show each command's first
paragraph as written, line breaks included: it has to be one line."""

from typing import Any

import typer.main

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
