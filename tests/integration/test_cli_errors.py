"""Every CLI failure is one line on stderr and a non-zero exit, never a traceback: bad
input, a database that cannot be reached, a malformed or non-PostgreSQL URL (exit 2, as any
bad setting), and anything unforeseen."""

from __future__ import annotations

import json
import logging
import socket
import time
import uuid

import pytest

from postrelay.core.migrate import head_revision, require_head, upgrade
from tests.integration.test_cli_admin import run
from tests.migrations import pretend_migrated_by_a_newer_postrelay, throwaway_database


def one_line_error(done, code: int = 1) -> str:
    assert done.returncode == code, (done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    return lines[0]


def test_cron_add_refuses_a_nul_and_a_5000_level_payload_in_one_line(worker_env, clean_db):
    line = one_line_error(run(worker_env, "cron", "add", "n1", "* * * * *", "reindex",
                              "--payload", '{"a": "\\u0000"}', ok=False))
    assert "payload.a" in line and "NUL" in line
    deep = '{"a": ' * 5000 + "1" + "}" * 5000
    line = one_line_error(run(worker_env, "cron", "add", "n2", "* * * * *", "reindex",
                              "--payload", deep, ok=False))
    assert "payload" in line and "64 levels" in line
    line = one_line_error(run(worker_env, "cron", "add", "n3", "* * * * *", "reindex",
                              "--payload", '{"a": ' * 100 + "1" + "}" * 100, ok=False))
    assert "64 levels" in line
    names = {e["name"] for e in json.loads(run(worker_env, "cron", "list", "--json").stdout)}
    assert not names & {"n1", "n2", "n3"}


@pytest.mark.parametrize(("args", "option"), [
    (("kinds", "--bogus"), "--bogus"),
    (("jobs", "list", "--limit", "many"), "--limit"),
    # Past POSTRELAY_WORKER_CONCURRENCY's bound, the option was taken and the worker ran.
    (("worker", "--concurrency", "10001"), "--concurrency"),
])
def test_a_usage_error_is_typers_usage_message_and_exit_2(worker_env, args, option):
    """An unknown option or a value of the wrong type is a usage error, shown as typer
    shows it (the usage line, the option at fault), not taken for a failed command."""
    done = run(worker_env, *args, ok=False)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Usage: postrelay" in done.stderr and option in done.stderr
    assert "error: unexpected" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("args", [
    ("outbox", "replay", "--event", "abc"),
    ("outbox", "status", "--tenant", "abc"),
    ("jobs", "show", "abc"),
    ("dlq", "retry", "abc"),
    ("emails", "show", "abc"),
    ("webhooks", "disable", "abc"),
])
def test_an_id_that_is_not_a_uuid_is_one_line(worker_env, clean_db, args):
    line = one_line_error(run(worker_env, *args, ok=False))
    assert "UUID" in line or "uuid" in line


@pytest.mark.parametrize("args", [
    ("status",), ("jobs", "list"), ("dlq", "list"), ("emails",), ("outbox", "status"),
    ("cron", "list"), ("webhooks", "list"), ("tenants", "add", "x"), ("migrate",),
    ("keys", "list"), ("worker",), ("relay",),
])
def test_an_unreachable_database_is_one_line(worker_env, args):
    env = {**worker_env, "POSTRELAY_DATABASE_URL": "postgresql://u:s3cret@127.0.0.1:1/nope"}
    line = one_line_error(run(env, *args, ok=False))
    assert "cannot reach the database" in line and "s3cret" not in line


def test_a_server_that_never_answers_is_given_up_on(worker_env):
    """A server (or a proxy, a firewall) that takes the connection and says nothing kept
    every command waiting for as long as the socket lived; now libpq gives up after
    10 s unless the URL says otherwise."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # connections complete in the backlog and are never answered
        url = f"postgresql://u@127.0.0.1:{silent.getsockname()[1]}/nope"
        for args in (("keys", "list"), ("migrate",)):
            started = time.monotonic()
            line = one_line_error(run({**worker_env, "POSTRELAY_DATABASE_URL": url}, *args,
                                      ok=False))
            assert line == "error: cannot reach the database: connection timeout expired"
            assert time.monotonic() - started < 30
        started = time.monotonic()
        env = {**worker_env, "POSTRELAY_DATABASE_URL": f"{url}?connect_timeout=2"}
        one_line_error(run(env, "status", ok=False))
        assert time.monotonic() - started < 8  # the URL's own timeout wins


def test_the_debug_log_of_a_failure_shows_the_traceback_but_not_the_password(worker_env):
    env = {**worker_env, "POSTRELAY_DATABASE_URL": "postgresql://u:s3cret@127.0.0.1:1/nope",
           "POSTRELAY_LOG_LEVEL": "DEBUG"}
    done = run(env, "status", ok=False)
    assert done.returncode == 1 and "Traceback" in done.stderr
    assert "s3cret" not in done.stderr + done.stdout


@pytest.mark.parametrize("url", [
    "postgresql://u:s3cret@host:notaport/db", "mysql://u:s3cret@host/db", "not a url at all",
])
def test_a_malformed_or_foreign_database_url_is_a_bad_setting(worker_env, url):
    env = {**worker_env, "POSTRELAY_DATABASE_URL": url}
    for args in (("status",), ("worker",), ("relay",), ("migrate",)):
        line = one_line_error(run(env, *args, ok=False), code=2)
        assert "POSTRELAY_DATABASE_URL" in line and "s3cret" not in line


def test_an_unmigrated_database_says_so(worker_env, server_url):
    with throwaway_database(server_url) as url:
        line = one_line_error(run({**worker_env, "POSTRELAY_DATABASE_URL": url}, "jobs", "list",
                                  ok=False))
        assert "postrelay migrate" in line
        # Behind by a column, not a table: it said only "column l.delivery does not exist".
        upgrade(url, "0010")
        line = one_line_error(run({**worker_env, "POSTRELAY_DATABASE_URL": url}, "emails",
                                  ok=False))
        assert "does not exist (run `postrelay migrate`)" in line, line


@pytest.mark.parametrize("command", ["worker", "relay"])
def test_a_worker_or_relay_stops_at_start_on_a_database_behind_its_migration(
        worker_env, server_url, command, caplog):
    """On an older schema they ran on, failing every claim and maintenance round with
    "relation does not exist" warnings. On one a newer postrelay migrated (a release rolled
    back) they start, saying so: refusing would stop every worker at once."""
    with throwaway_database(server_url) as url:
        env = {**worker_env, "POSTRELAY_DATABASE_URL": url}
        line = one_line_error(run(env, command, ok=False))
        assert line == "error: the database has none of postrelay's migrations yet: run " \
                       "`postrelay migrate`"
        upgrade(url, "0010")
        line = one_line_error(run(env, command, ok=False))
        assert line == ("error: the database is at migration 0010, this postrelay needs "
                        f"{head_revision()}: run `postrelay migrate`")
        upgrade(url)
        pretend_migrated_by_a_newer_postrelay(url)
        with caplog.at_level(logging.WARNING):
            require_head(url)  # no error: it runs
        assert "migration 0999, which this postrelay does not have" in caplog.text


@pytest.mark.parametrize(("name", "value", "rule"), [
    ("POSTRELAY_EMAIL_FROM", "noreply at acme", "is not a valid email address"),
    ("POSTRELAY_EMAIL_FROM", "a@acme.example\r\nBcc: b@acme.example", "line break"),
    ("POSTRELAY_EMAIL_MESSAGE_ID_DOMAIN", "acme example", "is not an ASCII domain name"),
])
def test_a_sender_identity_no_message_can_carry_stops_the_worker(worker_env, name, value,
                                                                  rule):
    """The worker started, and every email job that used the setting failed at sending."""
    line = one_line_error(run({**worker_env, name: value}, "worker", ok=False), code=2)
    assert line.startswith(f"error: {name}: ") and rule in line, line


def test_an_embedded_data_dir_that_is_a_file_is_a_bad_setting(worker_env, tmp_path):
    """initdb failed on it: pgserver's page of output, then "unexpected CalledProcessError"."""
    afile = tmp_path / "pgdata"
    afile.write_text("")
    env = {k: v for k, v in worker_env.items() if k != "POSTRELAY_DATABASE_URL"}
    for data_dir in (afile, afile / "inside"):
        line = one_line_error(run({**env, "POSTRELAY_EMBEDDED_DATA_DIR": str(data_dir)},
                                  "tenants", "list", ok=False), code=2)
        assert line == f"error: POSTRELAY_EMBEDDED_DATA_DIR: {afile} is a file, not a directory"


def test_an_embedded_data_dir_holding_other_files_is_a_bad_setting(worker_env, tmp_path):
    """initdb refused the folder: its page of output, then "unexpected CalledProcessError"
    naming the initdb command line."""
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "todo.txt").write_text("mine\n")
    env = {k: v for k, v in worker_env.items() if k != "POSTRELAY_DATABASE_URL"}
    done = run({**env, "POSTRELAY_EMBEDDED_DATA_DIR": str(folder)}, "tenants", "list", ok=False)
    assert one_line_error(done, code=2) == (
        f"error: POSTRELAY_EMBEDDED_DATA_DIR: {folder} holds other files and no PostgreSQL "
        "data; give a new or empty folder, or an embedded PostgreSQL's data folder")
    assert done.stdout == ""
    assert [p.name for p in folder.iterdir()] == ["todo.txt"]  # left as it was


@pytest.mark.parametrize("command", ["worker", "relay"])
@pytest.mark.parametrize(("app", "rule"), [
    ("nosuchmod", "cannot be imported: no module named 'nosuchmod'"),
    ("postrelay.nope.x", "cannot be imported: no module named 'postrelay.nope'"),
    ("", "not a module name"), ("../jobs", "not a module name"),
    ("myapp.jobs:handlers", "not a module name"),
])
def test_an_app_that_is_no_module_is_refused_naming_the_option(worker_env, command, app, rule):
    """These were "unexpected ModuleNotFoundError", "unexpected ValueError: Empty module
    name" or "unexpected TypeError: the 'package' argument is required"."""
    line = one_line_error(run(worker_env, command, "--app", app, ok=False), code=2)
    assert line.startswith(f"error: --app {app!r}: {rule}"), line


def test_a_ca_file_the_worker_cannot_read_is_a_bad_setting(worker_env, tmp_path):
    """A missing CA bundle, or one that holds no certificate, stopped the worker with only
    "No such file or directory" or the TLS library's words."""
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    for ca_file in (tmp_path / "missing.pem", garbage):
        env = {**worker_env, "POSTRELAY_SMTP_SECURITY": "starttls",
               "POSTRELAY_SMTP_CA_FILE": str(ca_file)}
        line = one_line_error(run(env, "worker", ok=False), code=2)
        assert line.startswith(f"error: POSTRELAY_SMTP_CA_FILE: cannot read {ca_file}: "), line


@pytest.mark.parametrize("args", [
    ("emails", "--recipient", "a\udcff@example.com"),
    ("emails", "--template", "welcome\udcff"),
    ("emails", "suppressed", "--address", "a\udcff@example.com"),
    ("emails", "suppressed", "--lifted", "--address", "a\udcff@example.com"),
    ("emails", "unsuppress", "a\udcff@example.com", "--tenant", str(uuid.UUID(int=1))),
])
def test_a_filter_that_is_not_utf8_names_the_option(worker_env, clean_db, args):
    """A byte that is not UTF-8 on the command line (the \\udcff it reads as) was
    "unexpected UnicodeEncodeError", naming neither the option nor the rule."""
    line = one_line_error(run(worker_env, *args, ok=False))
    assert "surrogate" in line and "unexpected" not in line
    assert line.split(":")[1].strip() in {"--recipient", "--template", "--address", "ADDRESS"}


@pytest.mark.parametrize(("module", "source", "says"), [
    ("nosuch_app_zz", None, "no module named 'nosuch_app_zz' in "),
    ("broken_app_zz", "raise RuntimeError('no config')", "RuntimeError: no config"),
    ("needy_app_zz", "import nosuch_dependency_zz",
     "ModuleNotFoundError: No module named 'nosuch_dependency_zz'"),
    ("exiting_app_zz", "import sys\nsys.exit(4)", "it called sys.exit(4)"),
])
def test_an_app_that_cannot_be_imported_names_the_option(worker_env, tmp_path, module,
                                                         source, says):
    """Was "unexpected ModuleNotFoundError" (exit 1, as for a failed run), and an app that
    called sys.exit at import ended the worker with no word at all."""
    if source is not None:
        (tmp_path / f"{module}.py").write_text(source)
    path = ":".join(p for p in (str(tmp_path), worker_env.get("PYTHONPATH")) if p)
    for command in ("worker", "relay"):
        done = run({**worker_env, "PYTHONPATH": path}, command, "--app", module, ok=False)
        line = one_line_error(done, code=2)
        assert line.startswith(f"error: --app {module!r}: cannot be imported: ") and says in line


def test_a_kind_asked_for_that_the_database_lacks_stops_the_worker_at_start(
    worker_env, clean_db, tmp_path
):
    """Its handler registered but the kind not migrated, the worker warned, then idled
    for good: the one kind it was asked to serve dropped."""
    (tmp_path / "unmigrated_app_zz.py").write_text(
        "from postrelay.queue import handler\n\n"
        "@handler('pdf_render_zz')\nasync def render(job):\n    pass\n")
    path = ":".join(p for p in (str(tmp_path), worker_env.get("PYTHONPATH")) if p)
    done = run({**worker_env, "PYTHONPATH": path}, "worker", "--app", "unmigrated_app_zz",
               "--kind", "pdf_render_zz", "--kind", "email_send", ok=False)
    line = one_line_error(done, code=2)
    assert line == ("error: kinds: 'pdf_render_zz' not in the database's mdm.job_kind enum; "
                    "add with `postrelay kinds add` and migrate"), line


@pytest.mark.parametrize("kind", ["", "email_send ", "nosuch"])
def test_a_kind_with_no_handler_is_named_so_that_it_shows(worker_env, clean_db, kind):
    """An empty kind, or one with a trailing space, read as nothing at all."""
    line = one_line_error(run(worker_env, "worker", "--kind", kind, ok=False), code=2)
    assert line == f"error: kinds: no handler registered for {kind!r}", line
