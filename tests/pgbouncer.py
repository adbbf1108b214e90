"""A PgBouncer of a test's (or a benchmark's) own: Debian's `pgbouncer` in
`pool_mode = transaction`, on a free loopback port, in front of whatever server a database
URL names (the embedded pgserver's Unix socket or a TCP server).

    with pgbouncer(database_url, folder) as bouncer:
        bouncer.url    # the same database through PgBouncer
        bouncer.log()  # what PgBouncer wrote

Clients need no password (`auth_type = any`): PgBouncer logs into the server as the URL's
user. PgBouncer refuses to run as root; as root it is started with `-u`, as the owner of
the server's socket folder (which only that user may enter) or as `nobody`.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from sqlalchemy import make_url

from postrelay.core.db import libpq_url, sqlalchemy_url
from tests.programs import find_program

START_TIMEOUT_SECS = 10.0
NOT_FOUND = ("pgbouncer not found on PATH or in /usr/sbin: install Debian's pgbouncer "
             "(apt-get install pgbouncer; .ci/run does) to run the PgBouncer tests")


def find_pgbouncer() -> str | None:
    return find_program("pgbouncer")


@dataclass
class PgBouncer:
    url: str  # SQLAlchemy URL (psycopg driver) of the database through PgBouncer
    port: int
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def libpq(self) -> str:
        return libpq_url(self.url)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _ini(server_url: str, port: int, pool_size: int) -> str:
    url = sqlalchemy_url(server_url)
    host = url.host or str(url.query.get("host", "/tmp"))
    target = [f"host={host}", f"port={url.port or 5432}", f"user={url.username or 'postgres'}"]
    if url.password:
        target.append(f"password={url.password}")
    return "\n".join([
        "[databases]",
        f"* = {' '.join(target)}",  # any database name, on that server
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        "unix_socket_dir =",
        "auth_type = any",
        "pool_mode = transaction",
        "max_client_conn = 1000",
        f"default_pool_size = {pool_size}",
        "log_connections = 0",
        "log_disconnections = 0",
        "",
    ])


def _run_as(server_url: str) -> list[str]:
    if os.geteuid() != 0:
        return []
    url = sqlalchemy_url(server_url)
    socket_dir = None if url.host else url.query.get("host")
    owner = pwd.getpwuid(os.stat(socket_dir).st_uid).pw_name if socket_dir else "nobody"
    return ["-u", "nobody" if owner == "root" else owner]


@contextmanager
def pgbouncer(database_url: str, folder: Path, *, pool_size: int = 20) -> Iterator[PgBouncer]:
    """PgBouncer in front of `database_url`'s server until the block ends."""
    binary = find_pgbouncer()
    if binary is None:
        raise FileNotFoundError(NOT_FOUND)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)  # readable by the user it runs as
    database = make_url(sqlalchemy_url(database_url)).database
    for attempt in range(3):  # the free port may be taken between probe and bind
        port = _free_port()
        ini = folder / "pgbouncer.ini"
        ini.write_text(_ini(database_url, port, pool_size))
        ini.chmod(0o644)
        log_path = folder / f"pgbouncer-{port}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen([binary, *_run_as(database_url), str(ini)],
                                       stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT)
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/{database}"
        bouncer = PgBouncer(url, port, log_path, process)
        try:
            _wait_ready(bouncer)
        except Exception:
            _stop(process)
            if attempt == 2:
                raise
            continue
        try:
            yield bouncer
        finally:
            _stop(process)
        return


def _wait_ready(bouncer: PgBouncer) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECS
    while True:
        if bouncer.process.poll() is not None:
            raise RuntimeError(f"pgbouncer exited with {bouncer.process.returncode}:\n"
                               f"{bouncer.log()}")
        try:
            with psycopg.connect(bouncer.libpq, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
