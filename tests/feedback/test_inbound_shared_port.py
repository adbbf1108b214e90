"""`postrelay inbound --processes N`: N receivers, each a process of its own, on one port
(SO_REUSEPORT), as one host with several cores runs them behind one MX. The kernel spreads
the connections over them, each records what it took, and they start and stop as one: one
that dies ends the set (its status the parent's), so a service manager restarts it whole.
A receiver started without the option still cannot take a port in use, and a bad setting is
refused once, before any process starts."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiosmtplib
import psutil

from tests.feedback.conftest import await_inbox_empty, free_ports, until_listening
from tests.feedback.test_inbound_processes import POSTRELAY, receiver_env
from tests.feedback.test_inbox import bounces

SHARED = re.compile(r"inbound: mail for \S+ on 127\.0\.0\.1:\d+, shared by process (\d+)")


@contextmanager
def receiver_set(env: dict[str, str], port: int, processes: int,
                 out: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`postrelay inbound --processes` on 127.0.0.1:port, what it prints in `out`; SIGTERM
    and a wait on the way out, if it still runs."""
    with out.open("wb") as stdout:
        parent = subprocess.Popen(
            [str(POSTRELAY), "inbound", "--host", "127.0.0.1", "--port", str(port),
             "--processes", str(processes)],
            env=env, stdout=stdout, stderr=subprocess.STDOUT)
    try:
        yield parent
    finally:
        if parent.poll() is None:
            parent.send_signal(signal.SIGTERM)
        parent.wait(timeout=60)


def receivers(parent: subprocess.Popen[bytes], out: Path, processes: int,
              timeout: float = 30.0) -> list[int]:
    """The pids of the set's receivers, once each has said it listens."""
    deadline = time.monotonic() + timeout
    while len(pids := SHARED.findall(out.read_text())) < processes:
        assert parent.poll() is None and time.monotonic() < deadline, out.read_text()
        time.sleep(0.05)
    return sorted(int(pid) for pid in pids)


def connections_by_process(pids: list[int], port: int) -> dict[int, int]:
    """How many established connections to `port` each process holds."""
    return {pid: sum(1 for c in psutil.Process(pid).net_connections(kind="tcp")
                     if c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)
            for pid in pids}


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_the_processes_share_the_port_and_record_what_each_took(
        worker_env, engine, tenant, look, return_path, tmp_path):
    port = free_ports(1)[0]
    made = bounces(engine, tenant, return_path, 40)
    out = tmp_path / "inbound.out"
    with receiver_set(receiver_env(worker_env), port, 2, out) as parent:
        pids = receivers(parent, out, 2)
        await until_listening(port)
        clients = [aiosmtplib.SMTP(hostname="127.0.0.1", port=port, timeout=10)
                   for _ in range(20)]
        await asyncio.gather(*(c.connect() for c in clients))
        try:
            held = connections_by_process(pids, port)
            # The kernel chose a receiver per connection: twenty all on one would be a
            # one in half a million chance.
            assert sum(held.values()) == 20 and all(held.values()), held
            await asyncio.gather(*(clients[i % 20].sendmail("", [verp], raw)
                                   for i, (_, verp, raw) in enumerate(made[:20])))
            await asyncio.gather(*(clients[i % 20].sendmail("", [verp], raw)
                                   for i, (_, verp, raw) in enumerate(made[20:])))
        finally:
            for client in clients:
                client.close()
        await await_inbox_empty(engine, timeout=30)

        # Without --reuse-port, a receiver cannot take the port from them.
        plain = subprocess.run([str(POSTRELAY), "inbound", "--host", "127.0.0.1", "--port",
                                str(port)], env=receiver_env(worker_env),
                               capture_output=True, text=True, timeout=60)
        assert plain.returncode == 2 and "Address already in use" in plain.stderr, plain

        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=60) == 0, out.read_text()
    assert all(gone(pid) for pid in pids)
    assert sorted(f["email_log_id"] for f in look.feedback()) == sorted(
        s["id"] for s, _, _ in made)  # each once


async def test_a_receiver_that_dies_ends_the_set_and_frees_the_port(worker_env, tmp_path):
    port = free_ports(1)[0]
    out = tmp_path / "inbound.out"
    with receiver_set(receiver_env(worker_env), port, 3, out) as parent:
        first, *others = receivers(parent, out, 3)
        await until_listening(port)
        psutil.Process(first).send_signal(signal.SIGKILL)
        assert parent.wait(timeout=60) == 128 + signal.SIGKILL
    assert all(gone(pid) for pid in others)
    assert f"postrelay.inbound.process_ended pid={first} status=137 stopping=2" \
        in out.read_text()
    with socket.socket() as probe:  # nobody listens there any more (closed sessions may wait)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
        probe.listen()


def refused_set(env: dict[str, str], port: int | None = None, code: int = 2) -> str:
    """The one line `postrelay inbound --processes 3` prints when a setting is bad; it
    exits `code` (2: a bad setting) before any process starts."""
    done = subprocess.run([str(POSTRELAY), "inbound", "--host", "127.0.0.1", "--port",
                           str(port or free_ports(1)[0]), "--processes", "3"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == code and done.stdout == "", (done.stdout, done.stderr)
    (line,) = done.stderr.splitlines()
    return line


def test_a_certificate_the_set_cannot_load_is_refused_once_before_any_process_starts(
        worker_env, ca, tmp_path):
    """Only the bounce domain was checked before the processes started: a key that is not
    the certificate's was refused by each of them, the same line N times, and a log line
    saying a process had ended."""
    cert, key = tmp_path / "cert.pem", tmp_path / "other.key"
    ca.issue_cert("localhost").cert_chain_pems[0].write_to_path(str(cert))
    ca.issue_cert("other").private_key_pem.write_to_path(str(key))
    line = refused_set(receiver_env(worker_env, POSTRELAY_INBOUND_TLS_CERT=str(cert),
                                    POSTRELAY_INBOUND_TLS_KEY=str(key)))
    assert line.startswith("error: POSTRELAY_INBOUND_TLS_CERT and POSTRELAY_INBOUND_TLS_KEY: "
                           f"cannot load {cert} and {key}: "), line


def test_a_public_url_the_set_cannot_link_to_is_refused_once(worker_env):
    line = refused_set(receiver_env(worker_env, POSTRELAY_PUBLIC_URL="ftp://mail.example"))
    assert line.startswith("error: POSTRELAY_PUBLIC_URL: must be https://"), line


def test_a_port_taken_is_refused_once_before_any_process_starts(worker_env):
    """Each process found the port taken: the same asyncio line N times, a log line that
    a process had ended, and exit 1."""
    with socket.socket() as holder:  # another server, not a receiver sharing the port
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        line = refused_set(receiver_env(worker_env), port=port)
    assert line == ("error: --host (POSTRELAY_INBOUND_HOST) and --port "
                    f"(POSTRELAY_INBOUND_PORT): cannot listen on 127.0.0.1:{port}: "
                    "Address already in use"), line


def test_a_database_the_set_cannot_reach_is_refused_once(worker_env):
    line = refused_set(receiver_env(
        worker_env, POSTRELAY_DATABASE_URL="postgresql://u:s3cret@127.0.0.1:1/nope"), code=1)
    assert line.startswith("error: cannot reach the database") and "s3cret" not in line
