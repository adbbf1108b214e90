"""Acceptance fixtures: real `postrelay worker` processes against a real PostgreSQL.

Tests wait on events — rows in the database, files the handlers write (see apps/), lines in
a worker's log — polled every 50 ms with a generous deadline, never on fixed sleeps.
Every subprocess a test starts is SIGKILLed at teardown if it is still alive.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import pytest
from pgserver._commands import pg_ctl
from sqlalchemy import Engine, create_engine, text

from postrelay.core.db import sqlalchemy_url, start_embedded
from postrelay.core.migrate import upgrade
from postrelay.queue import ensure_tenant
from tests.factories import TABLES_TO_CLEAN
from tests.pgbouncer import NOT_FOUND, PgBouncer, find_pgbouncer, pgbouncer

POSTRELAY = Path(sys.executable).parent / "postrelay"
REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS_APP = "tests.acceptance.apps.steps"
TALLY_APP = "tests.acceptance.apps.tally"

# Short timings, so that leases expire and maintenance runs within a test's few seconds.
FAST_SETTINGS = {
    "POSTRELAY_JOB_LEASE_SECS": "2",
    "POSTRELAY_MAINTENANCE_INTERVAL_SECS": "0.3",
    "POSTRELAY_WORKER_POLL_INTERVAL_SECS": "0.2",
    "POSTRELAY_JOB_RETRY_DELAY_SECS": "0.1",
    "POSTRELAY_WORKER_GRACE_SECS": "2",
}

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.05,
    what: str = "the condition",
) -> T:
    """Poll `predicate` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


class WorkerProcess:
    """One `postrelay worker` subprocess; its stdout and stderr go to `log_path`."""

    def __init__(self, popen: subprocess.Popen[bytes], log_path: Path) -> None:
        self.popen = popen
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def send(self, sig: signal.Signals) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        return self.popen.wait(timeout=timeout)


class WorkerPool:
    """Starts worker subprocesses and makes sure none outlives the test."""

    def __init__(self, env: Mapping[str, str], folder: Path) -> None:
        self.env = dict(env)
        self.folder = folder
        self.procs: list[WorkerProcess] = []

    def start(
        self, *, app: str = STEPS_APP, concurrency: int = 4,
        env: Mapping[str, str] | None = None, args: tuple[str, ...] = (),
    ) -> WorkerProcess:
        return self.start_command(
            ["worker", "--app", app, "--concurrency", str(concurrency), *args], "worker", env)

    def start_command(
        self, args: list[str], name: str, env: Mapping[str, str] | None = None
    ) -> WorkerProcess:
        """Any `postrelay` command (a relay, say) as a subprocess of this pool."""
        log_path = self.folder / f"{name}-{len(self.procs)}.log"
        cmd = [str(POSTRELAY), *args]
        with open(log_path, "wb") as log:
            # cwd: `--app` modules are found relative to the directory the command runs in.
            popen = subprocess.Popen(
                cmd, cwd=REPO_ROOT, env={**self.env, **(env or {})},
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C at the terminal is not meant for them
            )
        proc = WorkerProcess(popen, log_path)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.alive:
                proc.popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):  # unreapable: give up
                proc.popen.wait(timeout=10)
        # Shown by pytest only when the test failed.
        for proc in self.procs:
            print(f"--- {proc.log_path.name} (pid {proc.pid}, exit {proc.popen.returncode})")
            print(proc.log()[-5000:])


@pytest.fixture
def workers(worker_env: dict[str, str], tmp_path: Path) -> Iterator[WorkerPool]:
    pool = WorkerPool({**worker_env, **FAST_SETTINGS}, tmp_path)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    """The folder that the handlers in apps/ report into."""
    folder = tmp_path / "marks"
    folder.mkdir()
    return folder


# --- reading what happened --------------------------------------------------------------


def registered(engine: Engine, *procs: WorkerProcess) -> dict[int, str]:
    """pid → worker id, for the given processes that have registered in mdm.aa_worker."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT pid, id FROM mdm.aa_worker WHERE pid = ANY(:pids)"),
            {"pids": [p.pid for p in procs]},
        ).all()
    return {pid: worker_id for pid, worker_id in rows}


def wait_registered(engine: Engine, *procs: WorkerProcess) -> dict[int, str]:
    """Wait until every process has its heartbeat row (it is claiming from then on)."""
    def check() -> dict[int, str] | None:
        for proc in procs:
            assert proc.alive, f"worker {proc.pid} exited early:\n{proc.log()}"
        found = registered(engine, *procs)
        return found if len(found) == len(procs) else None

    return wait_for(check, what="the workers to register")


def job_state(engine: Engine, job_id: UUID) -> tuple[str, int]:
    with engine.connect() as conn:
        status, attempts = conn.execute(
            text("SELECT status::text, attempts FROM mdm.aa_job WHERE id = :id"), {"id": job_id}
        ).one()
    return status, attempts


def status_counts(engine: Engine, kind: str = "reindex") -> Counter[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT status::text, count(*) FROM mdm.aa_job "
                "WHERE job_kind::text = :kind GROUP BY status"
            ),
            {"kind": kind},
        ).all()
    return Counter({status: n for status, n in rows})


def audit_actions(engine: Engine, job_id: UUID) -> list[tuple[str, dict]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT action, detail FROM mdm.aa_job_audit WHERE job_id = :id ORDER BY id"),
            {"id": job_id},
        ).all()
    return [(action, detail) for action, detail in rows]


def starts(marks: Path, job_id: UUID) -> list[tuple[int, int]]:
    """(attempt, pid) of every run of `job_id` that began, in attempt order."""
    found = []
    for path in marks.glob(f"started.{job_id}.*"):
        _, _, attempt, pid = path.name.split(".")
        found.append((int(attempt), int(pid)))
    return sorted(found)


def finished(marks: Path, prefix: str = "finished") -> dict[int, list[str]]:
    """pid → the job ids that process finished, in order."""
    return {
        int(path.name.split(".")[1]): path.read_text().split()
        for path in marks.glob(f"{prefix}.*")
    }


# PgBouncer in transaction mode in front of this run's database, for a module's tests; a
# handful of server connections, so that clients share them as in production.
BOUNCER_POOL_SIZE = 4


@pytest.fixture(scope="module")
def bouncer(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgBouncer]:
    if find_pgbouncer() is None:
        pytest.skip(NOT_FOUND)
    with pgbouncer(database_url, tmp_path_factory.mktemp("pgbouncer"),
                   pool_size=BOUNCER_POOL_SIZE) as running:
        yield running


def pooled_env(bouncer: PgBouncer) -> dict[str, str]:
    """What a postrelay process needs to run through `bouncer`."""
    return {"POSTRELAY_DATABASE_URL": bouncer.url, "POSTRELAY_POOLER": "transaction"}


# A PostgreSQL server of a test module's own, which its tests stop and start.
@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory):
    """A PostgreSQL server of this module's own, migrated, that its tests stop and start."""
    uri, server = start_embedded(tmp_path_factory.mktemp("own-server") / "pgdata")
    try:
        upgrade(uri)
        yield uri, server
    finally:
        server.cleanup()


@pytest.fixture
def own_db(own_server) -> Iterator[tuple[str, Any, Engine, UUID]]:
    """The own server, up and emptied: its URL, handle, an engine and a tenant."""
    uri, server = own_server
    server.ensure_postgres_running()  # in case an earlier test failed while it was down
    engine = create_engine(sqlalchemy_url(uri), pool_pre_ping=True)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"TRUNCATE {', '.join(TABLES_TO_CLEAN)}"))
            tenant = ensure_tenant(conn, "acme")
        yield uri, server, engine, tenant
    finally:
        engine.dispose()


def stop_server(server: Any) -> None:
    """A fast shutdown: every connection is terminated, as in a crash or failover."""
    pg_ctl(["-w", "stop", "-m", "fast"], pgdata=server.pgdata, user=server.system_user)
