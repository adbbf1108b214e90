"""`postrelay email preview`: render from the command line, errors on one line."""

from __future__ import annotations

import email
import email.policy
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from postrelay.cli.main import app


@pytest.fixture(autouse=True)
def logging_as_it_was() -> Iterator[None]:
    """The command configures logging (`configure_logging`) with a handler on the stderr
    that CliRunner lends it and closes: left in place, it would make every later warning
    of this test run, from any thread, a "Logging error" on a closed stream."""
    handlers, level = logging.root.handlers[:], logging.root.level
    postrelay_level = logging.getLogger("postrelay").level
    yield
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)
    logging.getLogger("postrelay").setLevel(postrelay_level)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "templates"
    for relative, text in {
        "welcome/subject.txt": "Willkommen, {{ user }}!\n",
        "welcome/body.txt": "Hallo {{ user }},\nschön, dass du da bist.\n",
        "welcome/body.html": "<p>Hallo {{ user }}</p>\n",
        "welcome/template.toml": 'on_unknown = "hold"\n',
        "tenants/acme/welcome/subject.txt": "Acme: {{ user }}\n",
        "plain/subject.txt": "Plain\n",
        "plain/body.txt": "Text only\n",
    }.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(text, encoding="utf-8")
    return folder


@pytest.fixture
def context(tmp_path: Path) -> Path:
    path = tmp_path / "context.json"
    path.write_text(json.dumps({"user": "Jürgen <b>"}), encoding="utf-8")
    return path


# Unset (None) unless a test sets them, so the caller's environment cannot leak in.
EMAIL_SETTINGS = ("POSTRELAY_EMAIL_TEMPLATES_DIR", "POSTRELAY_EMAIL_FROM",
                  "POSTRELAY_EMAIL_MESSAGE_ID_DOMAIN")


def preview(*args: str | Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    environment: dict[str, str | None] = dict.fromkeys(EMAIL_SETTINGS)
    environment.update(env or {})
    result = CliRunner().invoke(app, ["email", "preview", *map(str, args)], env=environment)
    return result.exit_code, result.stdout, result.stderr


def test_text_format_prints_subject_and_text(root: Path, context: Path) -> None:
    code, out, _ = preview("welcome", "--context", context, "--templates", root)
    assert code == 0
    assert "Subject: Willkommen, Jürgen <b>!" in out
    assert "Hallo Jürgen <b>,\nschön, dass du da bist." in out
    assert "on_unknown=hold" in out and "version " in out


def test_tenant_override_is_used(root: Path, context: Path) -> None:
    code, out, _ = preview("welcome", "--context", context, "--templates", root,
                           "--tenant", "nobody", "--tenant", "acme")
    assert code == 0 and "Subject: Acme: Jürgen <b>" in out


def test_html_format_prints_the_escaped_html_only(root: Path, context: Path) -> None:
    code, out, _ = preview("welcome", "--context", context, "--templates", root,
                           "--format", "html")
    assert (code, out) == (0, "<p>Hallo Jürgen &lt;b&gt;</p>\n")
    code, _, err = preview("plain", "--templates", root, "--format", "html")
    assert code == 1 and err.startswith("error: ") and "body.html" in err


def test_raw_format_prints_a_mime_message(root: Path, context: Path) -> None:
    code, out, _ = preview("welcome", "--context", context, "--templates", root,
                           "--format", "raw", "--from", "Shop Ö <shop@example.com>",
                           "--to", "Ada <ada@example.test>", "--to", "bob@example.test")
    assert code == 0
    message = email.message_from_string(out, policy=email.policy.default)
    assert message["Subject"] == "Willkommen, Jürgen <b>!"
    assert str(message["From"]) == "Shop Ö <shop@example.com>"
    assert [a.addr_spec for a in message["To"].addresses] == ["ada@example.test",
                                                              "bob@example.test"]
    assert message["Message-ID"] == "<00000000-0000-0000-0000-000000000000@example.com>"
    assert [p.get_content_type() for p in message.iter_parts()] == ["text/plain", "text/html"]


def test_defaults_come_from_the_settings(root: Path, context: Path) -> None:
    env = {"POSTRELAY_EMAIL_TEMPLATES_DIR": str(root),
           "POSTRELAY_EMAIL_FROM": "Billing <billing@example.org>",
           "POSTRELAY_EMAIL_MESSAGE_ID_DOMAIN": "mid.example.org"}
    code, out, _ = preview("welcome", "--context", context, "--format", "raw", env=env)
    assert code == 0
    message = email.message_from_string(out, policy=email.policy.default)
    assert message["From"].addresses[0].addr_spec == "billing@example.org"
    assert message["Message-ID"].endswith("@mid.example.org>")


@pytest.mark.parametrize(("args", "problem"), [
    (["missing"], "unknown template"),
    (["welcome"], "'user' is undefined"),
    (["../welcome"], "TEMPLATE:"),
    (["welcome", "--format", "raw", "--to", "a@b.com, c@d.com"], "one address per string"),
    (["welcome", "--format", "raw", "--from", "x\r\nBcc: v@example.com <a@b.com>"],
     "header injection"),
    # A byte of the command line that was not UTF-8 (read as \udcff) in a display name was
    # "unexpected UnicodeEncodeError", naming neither the option nor the rule.
    (["welcome", "--format", "raw", "--from", "J\udcffrgen <a@b.com>"],
     "from: must not contain an unpaired surrogate"),
    (["welcome", "--format", "raw", "--to", '"J\udcffrgen" <a@b.com>'],
     "--to (to[0]): must not contain an unpaired surrogate"),
])
def test_errors_are_one_line_with_exit_code_1(root: Path, context: Path, args: list[str],
                                              problem: str) -> None:
    with_context = ["--context", str(context)] if args != ["welcome"] else []
    code, out, err = preview(*args, *with_context, "--templates", root)
    assert code == 1 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and problem in err


@pytest.mark.parametrize("fmt", ["text", "html", "raw"])
def test_a_subject_no_message_can_carry_fails_every_format(root: Path, context: Path,
                                                          fmt: str) -> None:
    """A subject that renders to two lines fails every send of the template; the text
    and html previews printed it with exit 0, as if all were well."""
    (root / "welcome" / "subject.txt").write_text("Hallo\n{{ user }}\n", encoding="utf-8")
    code, out, err = preview("welcome", "--context", context, "--templates", root,
                             "--format", fmt)
    assert code == 1 and out == ""
    assert err == "error: subject: must not contain a line break (header injection)\n"


@pytest.mark.parametrize(("content", "problem"), [
    (None, "cannot read"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
])
def test_a_bad_context_file_is_an_error(root: Path, tmp_path: Path, content: str | None,
                                        problem: str) -> None:
    path = tmp_path / "ctx.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    code, _, err = preview("welcome", "--context", path, "--templates", root)
    assert code == 1 and err.startswith("error: --context: ") and problem in err


def test_a_bad_setting_exits_2(root: Path) -> None:
    code, _, err = preview("plain", "--templates", root,
                           env={"POSTRELAY_SMTP_PORT": "not-a-port"})
    assert code == 2 and "POSTRELAY_SMTP_PORT" in err
