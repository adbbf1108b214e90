"""The files a template includes, imports or extends are files it uses: the `template_version`
the email log records changes with them, and a fixed one is what the next render sends."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from postrelay.orchestrator.templates import TemplateError, Templates
from tests.orchestrator.test_templates import write


@pytest.fixture
def root(tmp_path: Path) -> Path:
    write(tmp_path, "welcome/subject.txt", "Welcome, {{ name }}")
    write(tmp_path, "welcome/body.txt", "Hi {{ name }}\n{% include 'partials/footer.txt' %}")
    write(
        tmp_path,
        "welcome/body.html",
        "{% extends 'partials/layout.html' %}{% block main %}<p>{{ name }}</p>{% endblock %}",
    )
    write(tmp_path, "partials/footer.txt", "-- {% include 'partials/sign.txt' %}")
    write(tmp_path, "partials/sign.txt", "The Shop")
    write(tmp_path, "partials/layout.html", "<main>{% block main %}{% endblock %}</main>")
    return tmp_path


@pytest.mark.parametrize(
    "changed", ["partials/footer.txt", "partials/sign.txt", "partials/layout.html"]
)
def test_a_changed_include_changes_the_version(root: Path, changed: str) -> None:
    templates = Templates(root, reload_secs=0)
    before = templates.render("welcome", {"name": "Ada"})
    assert before.text == "Hi Ada\n-- The Shop"
    assert before.html == "<main><p>Ada</p></main>"

    path = root / changed
    write(
        root,
        changed,
        path.read_text()
        .replace("The Shop", "The Store")
        .replace("<main>", "<div>")
        .replace("-- ", "== "),
    )
    after = templates.render("welcome", {"name": "Ada"})
    assert (after.text, after.html) != (before.text, before.html)
    assert after.version != before.version


def test_an_include_changed_within_one_mtime_tick_is_rendered_and_versioned(root: Path) -> None:
    """Jinja reloads an include when its mtime changes; a fix written within the same
    tick (same size, same mtime) was not rendered, and the version did not move either."""
    templates = Templates(root, reload_secs=0)
    first = templates.render("welcome", {"name": "Ada"})
    path = root / "partials/sign.txt"
    stat = path.stat()
    write(root, "partials/sign.txt", "The Mall")  # as long as "The Shop"
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = templates.render("welcome", {"name": "Ada"})
    assert second.text == "Hi Ada\n-- The Mall"
    assert second.version != first.version


def test_a_missing_or_broken_include_is_still_the_renders_error(root: Path) -> None:
    templates = Templates(root, reload_secs=0)
    (root / "partials/sign.txt").unlink()
    with pytest.raises(TemplateError, match="sign.txt"):
        templates.render("welcome", {"name": "Ada"})
    write(root, "partials/sign.txt", "{% if %}")
    with pytest.raises(TemplateError, match="syntax error"):
        templates.render("welcome", {"name": "Ada"})
