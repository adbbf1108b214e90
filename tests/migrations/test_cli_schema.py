"""`postrelay migrate` and `postrelay kinds add`, run as real processes through the console
script, as an operator would run them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, text

from postrelay.core.db import sqlalchemy_url
from postrelay.core.migrate import MIGRATION_LOCK_KEY, head_revision, migrations_dir
from postrelay.queue import enqueue
from tests.migrations import SEED_KINDS, current_revision, enum_labels, throwaway_database

# Every test here runs `postrelay migrate` or `postrelay kinds add` as a process.
pytestmark = pytest.mark.processes
POSTRELAY = Path(sys.executable).parent / "postrelay"
TIMEOUT = 120
# A port nothing listens on: any attempt to connect fails at once.
UNREACHABLE_URL = "postgresql://x@127.0.0.1:1/none"
SYSTEM_TENANT = "00000000-0000-0000-0000-000000000000"


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(POSTRELAY), *args], env=env, capture_output=True, text=True, timeout=TIMEOUT
    )


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSTRELAY_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@pytest.fixture
def fresh_url(server_url: str) -> Iterator[str]:
    with throwaway_database(server_url) as url:
        yield url


@pytest.fixture
def migrations_copy(tmp_path: Path) -> Path:
    """A private copy of the migrations folder, so `kinds add` never writes into the repo."""
    copy = tmp_path / "migrations"
    shutil.copytree(migrations_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def script_dir(folder: Path, *version_locations: Path) -> ScriptDirectory:
    cfg = Config()
    cfg.set_main_option("script_location", str(folder))
    if version_locations:
        cfg.set_main_option("path_separator", "os")
        cfg.set_main_option("version_locations", os.pathsep.join(map(str, version_locations)))
    return ScriptDirectory.from_config(cfg)


def waiting_on_advisory_lock(conn: Connection) -> int:
    return conn.execute(
        text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
    ).scalar_one()


def db_state(url: str) -> tuple[str | None, list[str]]:
    eng = create_engine(sqlalchemy_url(url))
    try:
        with eng.connect() as conn:
            return current_revision(conn), enum_labels(conn, "job_kind")
    finally:
        eng.dispose()


# --- migrate --------------------------------------------------------------------------------


def test_migrate_brings_an_empty_database_to_head(fresh_url: str) -> None:
    result = run("migrate", env=base_env(POSTRELAY_DATABASE_URL=fresh_url))
    assert result.returncode == 0, result.stderr
    assert db_state(fresh_url) == (head_revision(), SEED_KINDS)
    again = run("migrate", env=base_env(POSTRELAY_DATABASE_URL=fresh_url))
    assert again.returncode == 0, again.stderr
    assert db_state(fresh_url) == (head_revision(), SEED_KINDS)


def test_two_migrate_processes_at_once_both_succeed(fresh_url: str) -> None:
    env = base_env(POSTRELAY_DATABASE_URL=fresh_url)
    eng = create_engine(sqlalchemy_url(fresh_url), isolation_level="AUTOCOMMIT")
    procs: list[subprocess.Popen[str]] = []
    try:
        # Hold the migrators' lock until both processes wait on it, so they really start
        # their migrations at the same moment instead of one after the other by luck.
        with eng.connect() as holder:
            holder.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            procs = [
                subprocess.Popen(
                    [str(POSTRELAY), "migrate"], env=env, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True,
                )
                for _ in range(2)
            ]
            deadline = time.monotonic() + TIMEOUT
            while waiting_on_advisory_lock(holder) < 2:
                assert all(p.poll() is None for p in procs), "a migrator exited early"
                assert time.monotonic() < deadline, "the migrators never queued on the lock"
                time.sleep(0.05)
            holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
        outcomes = [(p.communicate(timeout=TIMEOUT)[1], p.returncode) for p in procs]
        for stderr, code in outcomes:
            assert code == 0, stderr
        assert db_state(fresh_url) == (head_revision(), SEED_KINDS)
        # They took turns: the migration ran once, so its seed row exists once.
        with eng.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM mdm.aa_tenant")).scalar_one() == 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
        eng.dispose()


def test_migrate_sql_prints_ddl_without_touching_a_database() -> None:
    result = run("migrate", "--sql", env=base_env(POSTRELAY_DATABASE_URL=UNREACHABLE_URL))
    assert result.returncode == 0, result.stderr
    assert "CREATE TYPE mdm.job_kind" in result.stdout
    assert re.search(r"CREATE TABLE mdm\.aa_job \(", result.stdout)
    assert result.stdout.rstrip().endswith("COMMIT;")


def schema_definitions(url: str) -> set[str]:
    """Every index, constraint, function and trigger of `mdm` as PostgreSQL prints it."""
    eng = create_engine(sqlalchemy_url(url))
    try:
        with eng.connect() as conn:
            return set(conn.execute(text("""
                SELECT indexdef FROM pg_indexes WHERE schemaname = 'mdm'
                UNION ALL
                SELECT conname || ' ' || pg_get_constraintdef(c.oid) FROM pg_constraint c
                WHERE connamespace = 'mdm'::regnamespace
                UNION ALL
                SELECT pg_get_functiondef(p.oid) FROM pg_proc p
                WHERE pronamespace = 'mdm'::regnamespace
                UNION ALL
                SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class r
                  ON r.oid = t.tgrelid WHERE r.relnamespace = 'mdm'::regnamespace
                  AND NOT t.tgisinternal""")).scalars())
    finally:
        eng.dispose()


@pytest.mark.skipif(shutil.which("psql") is None, reason="needs psql")
def test_migrate_sql_run_in_psql_makes_the_schema_migrate_makes(
    fresh_url: str, server_url: str
) -> None:
    """A DBA's path: the printed SQL, run by psql, must build what `migrate` builds. Its `%`
    came out doubled (`LIKE 'outbox:%%'`), so the idempotency index's predicate no longer
    matched the one enqueue names in ON CONFLICT, and every enqueue failed."""
    script = run("migrate", "--sql", env=base_env(POSTRELAY_DATABASE_URL=UNREACHABLE_URL))
    assert script.returncode == 0, script.stderr
    with throwaway_database(server_url) as by_psql:
        applied = subprocess.run(
            ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d",
             by_psql.replace("postgresql+psycopg://", "postgresql://", 1)],
            input=script.stdout, capture_output=True, text=True, timeout=TIMEOUT,
        )
        assert applied.returncode == 0, applied.stderr
        assert run("migrate", env=base_env(POSTRELAY_DATABASE_URL=fresh_url)).returncode == 0
        assert db_state(by_psql) == db_state(fresh_url)
        assert schema_definitions(by_psql) == schema_definitions(fresh_url)
        # And it takes work: enqueue names the idempotency index in its ON CONFLICT.
        eng = create_engine(sqlalchemy_url(by_psql))
        try:
            with eng.begin() as conn:
                first = enqueue(conn, SEED_KINDS[0], {}, tenant_id=SYSTEM_TENANT,
                                idempotency_key="once")
                again = enqueue(conn, SEED_KINDS[0], {}, tenant_id=SYSTEM_TENANT,
                                idempotency_key="once")
            assert first == again
        finally:
            eng.dispose()


@pytest.mark.skipif(shutil.which("psql") is None, reason="needs psql")
def test_migrate_sql_waits_for_a_migration_in_progress(fresh_url: str,
                                                        tmp_path: Path) -> None:
    """The printed SQL took no lock: applied while `postrelay migrate` ran, the two raced
    on the same DDL. It now waits for the migration lock, as a migrating process does."""
    script = run("migrate", "--sql", env=base_env(POSTRELAY_DATABASE_URL=UNREACHABLE_URL))
    assert script.returncode == 0, script.stderr
    (tmp_path / "schema.sql").write_text(script.stdout)
    eng = create_engine(sqlalchemy_url(fresh_url))
    try:
        with eng.connect() as holder:
            holder.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            psql = subprocess.Popen(
                ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(tmp_path / "schema.sql"),
                 "-d", fresh_url.replace("postgresql+psycopg://", "postgresql://", 1)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            deadline = time.monotonic() + TIMEOUT
            while not waits_for_advisory_lock(eng):
                assert psql.poll() is None, psql.communicate()
                assert time.monotonic() < deadline, "psql never waited for the lock"
                time.sleep(0.05)
            with eng.connect() as conn:  # nothing made while it waits
                assert conn.execute(text(
                    "SELECT to_regclass('mdm.aa_job')")).scalar_one() is None
            holder.rollback()
        _, errors = psql.communicate(timeout=TIMEOUT)
        assert psql.returncode == 0, errors
        assert db_state(fresh_url)[0] == head_revision()
    finally:
        eng.dispose()


def waits_for_advisory_lock(eng) -> bool:  # type: ignore[no-untyped-def]
    with eng.connect() as conn:
        return bool(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND wait_event = 'advisory' AND datname = current_database()")).scalar_one())


# --- kinds add ------------------------------------------------------------------------------


def test_kinds_add_writes_a_revision_on_head_that_adds_the_value(
    migrations_copy: Path, fresh_url: str
) -> None:
    env = base_env(POSTRELAY_MIGRATIONS_DIR=str(migrations_copy))
    head_before = script_dir(migrations_copy).get_current_head()
    assert head_before is not None

    result = run("kinds", "add", "pdf_render", env=env)
    assert result.returncode == 0, result.stderr
    match = re.search(r"wrote (.+)", result.stdout)
    assert match, result.stdout
    written = Path(match.group(1).strip())
    assert written.parent == migrations_copy / "versions"
    assert "ALTER TYPE mdm.job_kind ADD VALUE IF NOT EXISTS 'pdf_render'" in written.read_text()

    scripts = script_dir(migrations_copy)
    new_head = scripts.get_current_head()  # also fails if the history now has two heads
    assert new_head != head_before
    assert scripts.get_revision(new_head).down_revision == head_before
    assert scripts.get_revision(new_head).path == str(written)

    env["POSTRELAY_DATABASE_URL"] = fresh_url
    result = run("migrate", env=env)
    assert result.returncode == 0, result.stderr
    assert db_state(fresh_url) == (new_head, [*SEED_KINDS, "pdf_render"])

    eng = create_engine(sqlalchemy_url(fresh_url))
    with eng.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload) "
                "VALUES ('00000000-0000-0000-0000-000000000000', 'pdf_render', '{}')"
            )
        )
    eng.dispose()


def test_kinds_add_with_dir_writes_there_on_top_of_the_head(
    migrations_copy: Path, tmp_path: Path
) -> None:
    out = tmp_path / "my_versions"
    out.mkdir()
    env = base_env(POSTRELAY_MIGRATIONS_DIR=str(migrations_copy))
    head_before = script_dir(migrations_copy).get_current_head()
    shipped = sorted(p.name for p in (migrations_copy / "versions").glob("*.py"))

    result = run("kinds", "add", "pdf_render", "--dir", str(out), env=env)
    assert result.returncode == 0, result.stderr
    files = list(out.glob("*.py"))
    assert len(files) == 1
    assert sorted(p.name for p in (migrations_copy / "versions").glob("*.py")) == shipped

    # Seen together with the shipped versions, the new file is the single head on top.
    scripts = script_dir(migrations_copy, migrations_copy / "versions", out)
    new_head = scripts.get_current_head()
    assert scripts.get_revision(new_head).path == str(files[0])
    assert scripts.get_revision(new_head).down_revision == head_before


# "pdf_render\n" passed the pattern's `$`, which matches before a final newline, and the
# migration written for it was a Python syntax error that broke every later migrate.
@pytest.mark.parametrize("name", ["Bad-Name", "pdf_render\n"])
def test_kinds_add_refuses_a_bad_name(migrations_copy: Path, tmp_path: Path, name: str) -> None:
    env = base_env(POSTRELAY_MIGRATIONS_DIR=str(migrations_copy))
    shipped = sorted((migrations_copy / "versions").glob("*.py"))
    result = run("kinds", "add", name, "--dir", str(tmp_path), env=env)
    assert result.returncode == 2, result.stderr
    assert repr(name) in result.stderr
    assert "lower-case letters, digits and underscores" in result.stderr
    assert list(tmp_path.glob("*.py")) == []
    assert sorted((migrations_copy / "versions").glob("*.py")) == shipped


# A kind the history already defines got a second, empty migration (ADD VALUE IF NOT
# EXISTS did nothing), and the operator learned nothing of the mistake.
@pytest.mark.parametrize("twice", [False, True], ids=["seed kind", "kind added before"])
def test_kinds_add_refuses_a_kind_that_exists(
    migrations_copy: Path, tmp_path: Path, twice: bool
) -> None:
    env = base_env(POSTRELAY_MIGRATIONS_DIR=str(migrations_copy))
    name = "pdf_render" if twice else "email_send"
    if twice:
        first = run("kinds", "add", name, "--dir", str(tmp_path), env=env)
        assert first.returncode == 0, first.stderr
    before = sorted(tmp_path.glob("*.py"))
    shipped = sorted((migrations_copy / "versions").glob("*.py"))

    result = run("kinds", "add", name, "--dir", str(tmp_path), env=env)
    assert result.returncode == 1, result.stderr
    assert f"job kind {name!r} already exists" in result.stderr
    assert (before[0].name if twice else "0001_queue_core.py") in result.stderr
    assert sorted(tmp_path.glob("*.py")) == before
    assert sorted((migrations_copy / "versions").glob("*.py")) == shipped
