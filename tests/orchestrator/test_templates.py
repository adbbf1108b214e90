"""Templates: files on disk, tenant overrides per file, strict and sandboxed rendering."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from postrelay.core.errors import ValidationError
from postrelay.orchestrator.templates import Rendered, TemplateError, Templates


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    write(tmp_path, "welcome/subject.txt", "  Welcome, {{ user.name }}!  \n")
    write(tmp_path, "welcome/body.txt",
          "Hello {{ user.name }},\n{% if vip %}\nyou are a VIP.\n{% endif %}\nBye\n")
    write(tmp_path, "welcome/body.html", "<p>Hello {{ user.name }}</p>\n")
    write(tmp_path, "plain/subject.txt", "Plain\n")
    write(tmp_path, "plain/body.txt", "Just text.\n")
    return tmp_path


CONTEXT = {"user": {"name": "Ada"}, "vip": False}


def test_render_gives_subject_text_html_and_a_short_version(root: Path) -> None:
    rendered = Templates(root).render("welcome", CONTEXT)
    assert rendered == Rendered(template="welcome", version=rendered.version,
                                subject="Welcome, Ada!", text="Hello Ada,\nBye",
                                html="<p>Hello Ada</p>", on_unknown="resend")
    assert len(rendered.version) == 12 and int(rendered.version, 16) >= 0
    assert Templates(root).render("welcome", CONTEXT).version == rendered.version
    assert Templates(root).render("welcome", {**CONTEXT, "vip": True}).text == (
        "Hello Ada,\nyou are a VIP.\nBye")


def test_a_template_without_body_html_has_no_html(root: Path) -> None:
    assert Templates(root).render("plain", {}).html is None


def test_names_lists_templates_but_not_the_tenants_folder(root: Path) -> None:
    write(root, "tenants/acme/welcome/subject.txt", "Acme")
    write(root, "partials/footer.txt", "--")
    assert Templates(root).names() == ["plain", "welcome"]
    assert Templates(root / "missing").names() == []


def test_html_is_autoescaped_and_text_is_not(root: Path) -> None:
    rendered = Templates(root).render("welcome", {"user": {"name": "<script>x</script>"},
                                                  "vip": False})
    assert rendered.html == "<p>Hello &lt;script&gt;x&lt;/script&gt;</p>"
    assert rendered.text.startswith("Hello <script>x</script>,")
    assert rendered.subject == "Welcome, <script>x</script>!"


def test_a_missing_variable_is_an_error_naming_it_the_file_and_the_line(root: Path) -> None:
    write(root, "welcome/body.txt", "Hello\n{{ user.name }}\n{{ order_number }}\n")
    with pytest.raises(TemplateError) as caught:
        Templates(root).render("welcome", CONTEXT)
    message = str(caught.value)
    assert "'welcome'" in message and "welcome/body.txt" in message
    assert "line 3" in message and "order_number" in message
    assert (caught.value.file, caught.value.line) == ("welcome/body.txt", 3)


def test_a_missing_attribute_and_a_missing_variable_in_a_condition_are_errors(
        root: Path) -> None:
    with pytest.raises(TemplateError, match="name"):
        Templates(root).render("welcome", {"user": {}, "vip": False})
    with pytest.raises(TemplateError, match="vip"):
        Templates(root).render("welcome", {"user": {"name": "Ada"}})


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ user.__init__.__globals__ }}",
    "{{ cycler.__init__.__globals__.os }}",
])
def test_the_sandbox_refuses_internals(root: Path, source: str) -> None:
    write(root, "welcome/subject.txt", source)
    with pytest.raises(TemplateError) as caught:
        Templates(root).render("welcome", CONTEXT)
    assert "welcome/subject.txt line 1" in str(caught.value)
    assert "sandbox" in str(caught.value) or "undefined" in str(caught.value)


def test_the_sandbox_refuses_to_mutate_the_context(root: Path) -> None:
    write(root, "welcome/subject.txt", "{{ items.append(1) }}")
    items: list[int] = []
    with pytest.raises(TemplateError, match="sandbox"):
        Templates(root).render("welcome", {**CONTEXT, "items": items})
    assert items == []


def test_a_syntax_error_names_the_file_and_the_line(root: Path) -> None:
    write(root, "welcome/body.html", "<p>\n{% if user %}\n</p>\n")
    with pytest.raises(TemplateError) as caught:
        Templates(root).render("welcome", CONTEXT)
    assert "welcome/body.html" in str(caught.value) and "syntax error" in str(caught.value)
    assert caught.value.line is not None


def test_unknown_template_and_missing_files(root: Path) -> None:
    with pytest.raises(TemplateError, match="unknown template"):
        Templates(root).render("nope", {})
    write(root, "half/subject.txt", "Half")
    with pytest.raises(TemplateError, match="body.txt"):
        Templates(root).render("half", {})
    write(root, "nosubject/body.txt", "Body")
    with pytest.raises(TemplateError, match="subject.txt"):
        Templates(root).render("nosubject", {})


@pytest.mark.parametrize("name", ["../etc", "a/b", ".hidden", "..", "", "tenants", "a\\b",
                                  "a" * 256])
def test_template_names_must_be_simple_names(root: Path, name: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Templates(root).render(name, {})
    assert caught.value.field == "template"


def test_a_tenant_override_replaces_only_its_files_and_changes_the_version(root: Path) -> None:
    templates = Templates(root)
    base = templates.render("welcome", CONTEXT)
    write(root, "tenants/acme/welcome/subject.txt", "Acme says hi to {{ user.name }}\n")
    acme = templates.render("welcome", CONTEXT, tenant_keys=["acme", "1234"])
    assert acme.subject == "Acme says hi to Ada"
    assert (acme.text, acme.html) == (base.text, base.html)
    assert acme.version != base.version
    # Other tenants and no tenant still get the shared files.
    assert templates.render("welcome", CONTEXT, tenant_keys=["other"]) == base


def test_tenant_keys_are_tried_in_order(root: Path) -> None:
    write(root, "tenants/acme/welcome/subject.txt", "by name")
    write(root, "tenants/42/welcome/subject.txt", "by id")
    write(root, "tenants/42/welcome/body.txt", "body by id")
    templates = Templates(root)
    rendered = templates.render("welcome", CONTEXT, tenant_keys=["acme", "42"])
    assert (rendered.subject, rendered.text) == ("by name", "body by id")
    assert templates.render("welcome", CONTEXT, tenant_keys=["42", "acme"]).subject == "by id"


def test_a_template_only_a_tenant_has(root: Path) -> None:
    write(root, "tenants/acme/invoice/subject.txt", "Invoice")
    write(root, "tenants/acme/invoice/body.txt", "Pay")
    assert Templates(root).render("invoice", {}, tenant_keys=["acme"]).subject == "Invoice"
    with pytest.raises(TemplateError, match="unknown template"):
        Templates(root).render("invoice", {}, tenant_keys=["other"])


def test_a_tenant_key_that_is_not_a_folder_name_has_no_overrides(tmp_path: Path) -> None:
    root = tmp_path / "templates"
    write(root, "welcome/subject.txt", "Welcome")
    write(root, "welcome/body.txt", "Body")
    write(tmp_path, "welcome/subject.txt", "outside")  # what tenants/../../welcome would reach
    for key in ["../..", "../../", "a/b", ".", "..", "", "x\0"]:
        rendered = Templates(root).render("welcome", {}, tenant_keys=[key])
        assert rendered.subject == "Welcome"


def test_a_tenant_name_too_long_for_a_folder_has_no_overrides(root: Path) -> None:
    """A tenant's name may hold 255 characters; 90 CJK ones are 270 bytes, more than a
    folder name can hold. Looking for its folder raised OSError (File name too long) once
    any tenant had overrides, and every message of that tenant was retried until dead."""
    write(root, "tenants/acme/welcome/subject.txt", "Acme's welcome")
    for key in ["名" * 90, "é" * 128, "x" * 256]:
        rendered = Templates(root).render("welcome", CONTEXT, tenant_keys=[key, "acme"])
        assert rendered.subject == "Acme's welcome"
    assert Templates(root).render("welcome", CONTEXT, tenant_keys=["é" * 127]).subject == \
        "Welcome, Ada!"


def test_policy_file_sets_on_unknown_and_can_be_overridden_per_tenant(root: Path) -> None:
    templates = Templates(root, reload_secs=0)
    assert templates.policy("welcome") == "resend"
    write(root, "welcome/template.toml", 'on_unknown = "hold"\n')
    assert templates.policy("welcome") == "hold"
    assert templates.render("welcome", CONTEXT).on_unknown == "hold"
    write(root, "tenants/acme/welcome/template.toml", 'on_unknown = "resend"\n')
    assert templates.policy("welcome", tenant_keys=["acme"]) == "resend"
    write(root, "plain/template.toml", "# nothing set\n")
    assert templates.policy("plain") == "resend"


@pytest.mark.parametrize(("toml", "problem"), [
    ('on_unknown = "maybe"', "'resend' or 'hold'"),
    ('on_unknonw = "hold"', "unknown key on_unknonw"),
    ("on_unknown = ", "not valid TOML"),
])
def test_a_bad_policy_file_is_a_template_error(root: Path, toml: str, problem: str) -> None:
    write(root, "welcome/template.toml", toml)
    with pytest.raises(TemplateError, match="template.toml") as caught:
        Templates(root).policy("welcome")
    assert problem in str(caught.value)
    with pytest.raises(TemplateError):
        Templates(root).render("welcome", CONTEXT)


def test_a_byte_order_mark_an_editor_wrote_is_not_part_of_the_template(root: Path) -> None:
    """UTF-8 with a BOM is still UTF-8: template.toml was "Invalid statement (at line 1,
    column 1)", and the subject (and an included file) began with an invisible U+FEFF."""
    bom = "\ufeff"
    write(root, "welcome/template.toml", bom + 'on_unknown = "hold"\n')
    write(root, "welcome/subject.txt", bom + "Welcome, {{ user.name }}!\n")
    write(root, "welcome/body.txt", "{% include 'footer.txt' %}")
    write(root, "footer.txt", bom + "Bye\n")
    rendered = Templates(root).render("welcome", CONTEXT)
    assert (rendered.on_unknown, rendered.subject, rendered.text) == (
        "hold", "Welcome, Ada!", "Bye")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_fixed_file_is_used_within_the_reload_window_without_a_restart(root: Path) -> None:
    clock = Clock()
    templates = Templates(root, reload_secs=1.0, clock=clock)
    write(root, "welcome/body.txt", "Hello {{ usr.name }}")  # the bug
    with pytest.raises(TemplateError, match="usr"):
        templates.render("welcome", CONTEXT)
    path = write(root, "welcome/body.txt", "Hello {{ user.name }}")  # the fix
    with pytest.raises(TemplateError, match="usr"):  # read less than reload_secs ago
        templates.render("welcome", CONTEXT)
    clock.now += 1.0
    first = templates.render("welcome", CONTEXT)
    assert first.text == "Hello Ada"
    # Same size, same mtime: a change within one mtime tick is still seen.
    stat = path.stat()
    write(root, "welcome/body.txt", "Howdy {{ user.name }}")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    clock.now += 1.0
    second = templates.render("welcome", CONTEXT)
    assert second.text == "Howdy Ada"
    assert second.version != first.version


def test_include_works_and_trailing_newline_of_the_subject_is_stripped(root: Path) -> None:
    write(root, "partials/footer.txt", "-- \nThe Shop")
    write(root, "welcome/body.txt", "Hi {{ user.name }}\n{% include 'partials/footer.txt' %}\n")
    rendered = Templates(root).render("welcome", CONTEXT)
    assert rendered.text == "Hi Ada\n-- \nThe Shop"
    assert rendered.subject == "Welcome, Ada!"


def test_jinja_globals_are_there_for_templates_and_a_context_never_leaks(root: Path) -> None:
    """The compiled templates keep their own copy of the environment's globals."""
    write(root, "globals/subject.txt", "{% for i in range(3) %}{{ i }}{% endfor %}")
    write(root, "globals/body.txt", "{{ dict(a=name) }} {{ namespace(n=1).n }} {{ name }}")
    templates = Templates(root)
    first = templates.render("globals", {"name": "Ada"})
    assert (first.subject, first.text) == ("012", "{'a': 'Ada'} 1 Ada")
    with pytest.raises(TemplateError, match="undefined variable"):
        templates.render("globals", {})  # Ada is not left behind for the next message
    assert templates.render("globals", {"name": "Bo"}).text == "{'a': 'Bo'} 1 Bo"
