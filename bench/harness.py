"""What every benchmark section needs: a throw-away database, a worker subprocess that is
always stopped, a clean queue to start from, and a table to print the figures in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from sqlalchemy import Engine, create_engine, make_url, text

from bench.cpu import CpuMeter
from postrelay.core.db import libpq_url, open_database
from postrelay.core.migrate import upgrade
from postrelay.core.settings import load_settings
from postrelay.queue import JobSpec, enqueue_many, ensure_tenant

REPO_ROOT = Path(__file__).resolve().parent.parent
# What the `postrelay` console script (and `python -m postrelay`) runs, as a `-c` program,
# so that the profiled form below can wrap it.
WORKER_MAIN = "from postrelay.cli import app; app()"
# The same under cProfile; the output path comes from the environment. cProfile.run swallows
# the SystemExit that typer raises at the end, then writes the profile.
WORKER_MAIN_PROFILED = (
    "import cProfile, os; from postrelay.cli import app; "
    "cProfile.run('app()', os.environ['BENCH_PROFILE_OUT'])"
)
STOP_GRACE_SECS = 15.0


@dataclass
class BenchDatabase:
    """A fresh, migrated database on the chosen server, with one tenant."""

    url: str  # SQLAlchemy URL (psycopg driver), what POSTRELAY_DATABASE_URL gets
    libpq: str  # the same for plain psycopg
    server: str  # "embedded" or the server's URL without password
    tenant_id: UUID
    engine: Engine  # sync engine with SQLAlchemy's defaults (no pre-ping)

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(self.libpq, **kwargs)

    def cpu_meter(self, processes: dict[str, int]) -> CpuMeter:
        """A CpuMeter of these processes and of this database's server alone."""
        with self.connect() as conn:
            return CpuMeter(processes, server_backend=conn.info.backend_pid)


@contextmanager
def bench_database() -> Iterator[BenchDatabase]:
    """POSTRELAY_DATABASE_URL's server, else the embedded one; a database created for this
    run (CREATE DATABASE + migrations, as tests/conftest.py does) and dropped afterwards."""
    settings = load_settings()
    db = open_database(settings)
    name = f"postrelay_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    # Pre-ping: the database is still dropped at the end after the server restarted
    # meanwhile (bench/soak.py restarts it).
    admin = create_engine(db.url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    engine: Engine | None = None
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            url = db.url.set(database=name).render_as_string(hide_password=False)
            upgrade(url)
            engine = create_engine(make_url(url))
            with engine.begin() as conn:
                tenant_id = ensure_tenant(conn, "bench")
            server = "embedded (pgserver)" if db.embedded is not None else db.url.set(
                drivername="postgresql", database=name
            ).render_as_string(hide_password=True)
            yield BenchDatabase(url, libpq_url(url), server, tenant_id, engine)  # type: ignore[arg-type]
        finally:
            if engine is not None:
                engine.dispose()
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
        db.close()


def reset_queue(bench: BenchDatabase) -> None:
    """Empty the queue tables, so each section starts from the same state."""
    with bench.connect(autocommit=True) as conn:
        # CASCADE: the email log references jobs (and is emptied with them here).
        conn.execute("TRUNCATE mdm.aa_job, mdm.aa_job_audit, mdm.aa_worker, mdm.aa_lease CASCADE")


def prefill(bench: BenchDatabase, n: int, *, batch: int = 10_000) -> None:
    """`n` pending no-op jobs of kind `reindex`, inserted with enqueue_many; then VACUUM
    ANALYZE, so that every drain (ours and the baselines) starts from a table in the same
    shape, with statistics and a fresh visibility map."""
    reset_queue(bench)
    fill(bench, n, batch=batch)


def fill(bench: BenchDatabase, n: int, *, batch: int = 10_000) -> None:
    """`n` pending no-op `reindex` jobs beside whatever the table holds, then VACUUM
    ANALYZE."""
    quiet = bench.engine.execution_options(postrelay_notify=False)
    for start in range(0, n, batch):
        specs = [JobSpec("reindex", {"n": i}, bench.tenant_id)
                 for i in range(start, min(n, start + batch))]
        with quiet.begin() as conn:
            enqueue_many(conn, specs)
    with bench.connect(autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE mdm.aa_job")


@dataclass(frozen=True)
class Drained:
    """What the database says about a drain. `now()` is the transaction's start time, so
    each distinct claimed_at is one claim transaction and each distinct completed_at one
    completion write (two transactions starting in the same microsecond would count once)."""

    done: int
    per_sec: float
    claims: int
    completions: int

    def detail(self) -> str:
        return (f"{self.claims:,} claims ({self.done / max(self.claims, 1):.1f} jobs each), "
                f"{self.completions:,} completion writes "
                f"({self.done / max(self.completions, 1):.1f} jobs each)")


def drained(bench: BenchDatabase) -> Drained:
    """Throughput measured by the database: done / (last completion - first claim), so the
    start-up of whatever drained the jobs does not count."""
    with bench.connect() as conn:
        count, span, claims, completions = conn.execute(
            "SELECT count(*), EXTRACT(EPOCH FROM max(completed_at) - min(claimed_at))::float8,"
            " count(DISTINCT claimed_at), count(DISTINCT completed_at)"
            " FROM mdm.aa_job WHERE status = 'done'"
        ).fetchone()  # type: ignore[misc]
    return Drained(count, count / span if span else float("nan"), claims, completions)


def unfinished_count(conn: psycopg.Connection[Any]) -> int:
    """Pending and running jobs, each counted through its own partial index. Beside a long
    history a count of `status IN ('pending', 'running')` is a parallel scan of the whole
    table, whose workers would take the CPU from the drain being watched."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM mdm.aa_job WHERE status = 'pending')"
        " + (SELECT count(*) FROM mdm.aa_job WHERE status = 'running')").fetchone()
    return row[0]  # type: ignore[index]


def done_count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM mdm.aa_job WHERE status = 'done'").fetchone()
    return row[0]  # type: ignore[index]


@dataclass
class WorkerProcess:
    """`postrelay worker --app APP --concurrency C --no-maintenance` as a subprocess (with
    `maintenance`, without the flag: it takes part in maintenance as a deployed worker
    does), or `python ARGV...` when `argv` is given. Use as a context manager: on the way
    out it gets SIGTERM, and SIGKILL if it has not stopped within STOP_GRACE_SECS."""

    bench: BenchDatabase
    app: str = ""
    concurrency: int = 0
    env: dict[str, str] = field(default_factory=dict)
    profile_out: Path | None = None
    argv: list[str] | None = None
    # Where it runs, and so which postrelay it imports: another checkout (an older commit's
    # tree, say) measures that code against this run's database.
    cwd: Path = REPO_ROOT
    maintenance: bool = False
    proc: subprocess.Popen[bytes] | None = None
    _stderr: Any = None

    def __enter__(self) -> WorkerProcess:
        env = dict(os.environ)
        env.update(self.env)
        # The bench database, unless `env` names another way to it (PgBouncer, say).
        env["POSTRELAY_DATABASE_URL"] = self.env.get("POSTRELAY_DATABASE_URL", self.bench.url)
        env["POSTRELAY_LOG_LEVEL"] = "WARNING"
        env["PYTHONUNBUFFERED"] = "1"
        main = WORKER_MAIN
        if self.profile_out is not None:
            env["BENCH_PROFILE_OUT"] = str(self.profile_out)
            main = WORKER_MAIN_PROFILED
        argv = self.argv or ["-c", main, "worker", "--app", self.app,
                             "--concurrency", str(self.concurrency),
                             *([] if self.maintenance else ["--no-maintenance"])]
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, *argv],
            cwd=self.cwd, env=env, stdin=subprocess.DEVNULL, stdout=self._stderr,
            stderr=subprocess.STDOUT,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"worker exited with code {self.proc.returncode}:\n{self.output()}"
            )

    def output(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(STOP_GRACE_SECS)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        finally:
            if proc.poll() is None:  # interrupted while waiting: do not leave it behind
                proc.kill()
                proc.wait()
            if self._stderr is not None:
                self._stderr.close()
                self._stderr = None


def wait_until(predicate: Any, *, timeout: float, poll: float = 0.05,
               worker: WorkerProcess | None = None, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if worker is not None:
            worker.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


@dataclass
class Row:
    metric: str
    ours: str
    baseline: str = "-"
    ratio: str = "-"
    target: str = "-"
    met: str = ""


def print_table(rows: list[Row]) -> None:
    header = Row("metric", "postrelay", "baseline", "ratio", "target", "met")
    cells = [[r.metric, r.ours, r.baseline, r.ratio, r.target, r.met] for r in [header, *rows]]
    widths = [max(len(c[i]) for c in cells) for i in range(6)]
    right = {1, 2, 3}
    for n, c in enumerate(cells):
        print("  ".join(
            c[i].rjust(widths[i]) if i in right else c[i].ljust(widths[i]) for i in range(6)
        ).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def rate(jobs_per_sec: float) -> str:
    return f"{jobs_per_sec:,.0f}/s"


def ratio(ours: float, baseline: float) -> str:
    return f"{ours / baseline:.2f}x" if baseline else "-"


def met(ok: bool) -> str:
    return "yes" if ok else "NO"
