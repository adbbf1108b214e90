"""`postrelay migrate` given a target it cannot reach, or a database a newer postrelay
migrated: one line that says what to do, exit 2 (a bad --revision) or 1, nothing run and
no SQL printed; and what it prints is where the database is."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from sqlalchemy import create_engine, text

from postrelay.core.db import sqlalchemy_url
from postrelay.core.migrate import (
    MIGRATION_LOCK_KEY,
    head_revision,
    migrations_dir,
    scripts,
    upgrade,
)
from tests.migrations import (
    current_revision,
    pretend_migrated_by_a_newer_postrelay,
    throwaway_database,
)
from tests.migrations.test_cli_schema import (
    POSTRELAY,
    TIMEOUT,
    UNREACHABLE_URL,
    base_env,
    run,
    waiting_on_advisory_lock,
)

pytestmark = pytest.mark.processes


def revision_of(url: str) -> str | None:
    eng = create_engine(sqlalchemy_url(url))
    try:
        with eng.connect() as conn:
            return current_revision(conn)
    finally:
        eng.dispose()


@pytest.fixture(scope="module")
def at_0010(server_url: str):
    with throwaway_database(server_url) as url:
        upgrade(url, "0010")
        yield url


@pytest.mark.parametrize(("revision", "rule"), [
    ("", "must name a migration"),
    (" 0011", "must name a migration"),
    ("bogus", "'bogus' is not a migration of this postrelay"),
    ("0099", "'0099' is not a migration of this postrelay"),
    ("-1", "never goes back"),
    ("0011:0012", "--sql only"),
])
def test_a_target_it_cannot_reach_is_refused_before_anything_runs(at_0010, revision, rule):
    """These were "unexpected AssertionError" or "unexpected CommandError", exit 1."""
    done = run("migrate", "--revision", revision, env=base_env(POSTRELAY_DATABASE_URL=at_0010))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: --revision: ") and rule in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stdout == ""
    assert revision_of(at_0010) == "0010"


def test_migrate_sql_with_a_bad_target_prints_no_sql():
    """The offline SQL began on stdout before alembic found the target missing."""
    done = run("migrate", "--sql", "--revision", "bogus",
               env=base_env(POSTRELAY_DATABASE_URL=UNREACHABLE_URL))
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.startswith("error: --revision: 'bogus'")


def test_migrate_prints_the_revision_reached_not_the_target(server_url):
    """`--revision 0005` on a database at 0010 printed "database at revision 0005" while
    the database stayed at 0010; `+1` printed "+1"."""
    with throwaway_database(server_url) as url:
        env = base_env(POSTRELAY_DATABASE_URL=url)
        assert run("migrate", "--revision", "0010", env=env).stdout == "database at revision 0010\n"
        assert run("migrate", "--revision", "0005", env=env).stdout == "database at revision 0010\n"
        assert run("migrate", "--revision", "+1", env=env).stdout == "database at revision 0011\n"
        assert revision_of(url) == "0011"


def test_a_relative_target_past_the_newest_migration_stops_at_it(server_url):
    """`+1` on a database at head was "unexpected CommandError: Relative revision +1 didn't
    produce 1 migrations", exit 1: like a target the database is past, it now does what
    there is to do and says where the database is."""
    head = head_revision()
    assert head is not None
    before = scripts().get_revision(head).down_revision
    assert isinstance(before, str)
    with throwaway_database(server_url) as url:
        env = base_env(POSTRELAY_DATABASE_URL=url)
        assert run("migrate", "--revision", before, env=env).returncode == 0
        done = run("migrate", "--revision", "+3", env=env)
        assert (done.returncode, done.stdout) == (0, f"database at revision {head}\n"), \
            done.stderr
        done = run("migrate", "--revision", "+1", env=env)
        assert (done.returncode, done.stdout) == (0, f"database at revision {head}\n"), \
            done.stderr
        assert revision_of(url) == head


def test_a_database_a_newer_postrelay_migrated_is_left_alone_with_what_to_do(server_url):
    """It was "unexpected CommandError: Can't locate revision identified by '0099'"."""
    with throwaway_database(server_url) as url:
        upgrade(url, "0010")
        pretend_migrated_by_a_newer_postrelay(url, "0099")
        done = run("migrate", env=base_env(POSTRELAY_DATABASE_URL=url))
        assert done.returncode == 1 and done.stdout == "", done.stdout
        assert done.stderr == ("error: the database is at migration 0099, which this postrelay "
                               f"does not have (its newest is {head_revision()}): a newer "
                               "postrelay migrated it; run that version or a later one\n")
        assert revision_of(url) == "0099"


def test_a_migrations_folder_that_cannot_be_read_is_a_bad_setting(tmp_path, server_url):
    """A version file that is not valid Python (one `kinds add` wrote for a name ending in
    a newline, say) was "unexpected SyntaxError: invalid syntax (bad.py, line 3)", exit 1,
    from every command that reads the migrations; a folder without env.py exit 1 too."""
    copy = tmp_path / "migrations"
    shutil.copytree(migrations_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    bad = copy / "versions" / "bad.py"
    bad.write_text('revision = "x"\ndown_revision = "0028"\ndef upgrade(:\n')
    with throwaway_database(server_url) as url:
        env = base_env(POSTRELAY_DATABASE_URL=url, POSTRELAY_MIGRATIONS_DIR=str(copy))
        for args in (("migrate",), ("migrate", "--sql"), ("worker",)):
            done = run(*args, env=env)
            assert done.returncode == 2 and done.stdout == "", (args, done.stdout)
            assert done.stderr == f"error: migration file {bad} line 3: invalid syntax; fix " \
                                  "or remove it\n", done.stderr
        assert revision_of(url) is None
    done = run("migrate", env=base_env(POSTRELAY_DATABASE_URL=UNREACHABLE_URL,
                                       POSTRELAY_MIGRATIONS_DIR=str(tmp_path)))
    assert done.returncode == 2 and done.stderr.startswith(
        f"error: POSTRELAY_MIGRATIONS_DIR: {tmp_path} holds no env.py"), done.stderr


def test_a_newer_postrelay_migrating_while_it_waits_for_the_lock_is_said_so(server_url):
    """Checked only before the lock, a newer postrelay's migration that committed while
    this one waited its turn was "unexpected CommandError: Can't locate revision
    identified by '0099'"."""
    with throwaway_database(server_url) as url:
        upgrade(url)
        eng = create_engine(sqlalchemy_url(url), isolation_level="AUTOCOMMIT")
        migrator = None
        try:
            with eng.connect() as holder:
                holder.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
                migrator = subprocess.Popen(
                    [str(POSTRELAY), "migrate"], env=base_env(POSTRELAY_DATABASE_URL=url),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                deadline = time.monotonic() + TIMEOUT
                while waiting_on_advisory_lock(holder) < 1:
                    assert migrator.poll() is None, migrator.communicate()
                    assert time.monotonic() < deadline, "the migrator never queued on the lock"
                    time.sleep(0.05)
                pretend_migrated_by_a_newer_postrelay(url, "0099")
                holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
            out, err = migrator.communicate(timeout=TIMEOUT)
        finally:
            if migrator is not None and migrator.poll() is None:
                migrator.kill()
                migrator.communicate()
            eng.dispose()
        assert (migrator.returncode, out) == (1, ""), err
        assert err == ("error: the database is at migration 0099, which this postrelay does "
                       f"not have (its newest is {head_revision()}): a newer postrelay "
                       "migrated it; run that version or a later one\n")
        assert revision_of(url) == "0099"
