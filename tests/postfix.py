"""A Postfix of a test's own: Debian's `postfix` as a relay on a free loopback port, its
configuration, queue and log in a folder, each domain routed to a given SMTP server on
loopback (a mailbox host, the bounce domain's MX). It relays for loopback clients and
bounces what is refused to the envelope sender, as a deployment's relay does.

    with postfix(routes={"bounces.example": 2525, "rejecting.example": 2526},
                 tls=Certificate(cert_pem, key_pem)) as relay:
        relay.port   # where clients submit mail (STARTTLS offered, with `tls`)
        relay.log()  # what it logged

With a certificate it offers STARTTLS to its clients, and takes STARTTLS wherever the
servers it relays to offer it (opportunistic, as MTAs deliver); each session's TLS is
logged.

Postfix's master runs in the foreground (`start-fg`), so the test owns the process. Its
daemons run as the `postfix` user, so only root can start it (the tests skip otherwise), and
its folder is one of its own under the system's temporary folder, which that user can
enter (pytest's are root's alone); it is removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.programs import find_program

START_TIMEOUT_SECS = 20.0
HOSTNAME = "mx.relay.example"
# Only the services a relay uses; none chrooted (the folder is not set up for it).
MASTER_CF = """\
127.0.0.1:{port} inet n - n - - smtpd
cleanup   unix  n - n - 0 cleanup
qmgr      unix  n - n 300 1 qmgr
rewrite   unix  - - n - - trivial-rewrite
bounce    unix  - - n - 0 bounce
defer     unix  - - n - 0 bounce
trace     unix  - - n - 0 bounce
verify    unix  - - n - 1 verify
flush     unix  n - n 1000? 0 flush
proxymap  unix  - - n - - proxymap
smtp      unix  - - n - - smtp
relay     unix  - - n - - smtp
showq     unix  n - n - - showq
error     unix  - - n - - error
retry     unix  - - n - - error
discard   unix  - - n - - discard
anvil     unix  - - n - 1 anvil
scache    unix  - - n - 1 scache
tlsmgr    unix  - - n 1000? 1 tlsmgr
postlog   unix-dgram n - n - 1 postlogd
"""


def unavailable() -> str | None:
    """Why no Postfix of a test's own can run here, or None."""
    if find_postfix() is None:
        return ("postfix not found on PATH or in /usr/sbin: install Debian's postfix "
                "(apt-get install postfix; .ci/run does) to run the Postfix tests")
    if os.geteuid() != 0:
        return "Postfix runs its daemons as the postfix user: only root can start one"
    return None


def find_postfix() -> str | None:
    return find_program("postfix")


@dataclass(frozen=True)
class Certificate:
    cert_pem: bytes  # the chain, leaf first
    key_pem: bytes


@dataclass
class Postfix:
    port: int
    log_path: Path
    process: subprocess.Popen[bytes]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _main_cf(folder: Path, routes: Mapping[str, int], tls: Certificate | None) -> str:
    transports = ", ".join(f"{domain}=smtp:[127.0.0.1]:{port}"
                           for domain, port in routes.items())
    encrypted = [] if tls is None else [
        f"smtpd_tls_cert_file = {folder / 'tls' / 'cert.pem'}",
        f"smtpd_tls_key_file = {folder / 'tls' / 'key.pem'}",
        "smtpd_tls_security_level = may",
        "smtpd_tls_loglevel = 1",
        "smtp_tls_security_level = may",
        "smtp_tls_loglevel = 1",
    ]
    return "\n".join([
        "compatibility_level = 3.6",
        f"queue_directory = {folder / 'queue'}",
        f"data_directory = {folder / 'data'}",
        f"myhostname = {HOSTNAME}",
        "mydestination =",
        "inet_interfaces = 127.0.0.1",
        "inet_protocols = ipv4",
        "mynetworks = 127.0.0.0/8",
        "alias_maps =",
        "alias_database =",
        f"transport_maps = inline:{{ {transports} }}",
        "maillog_file = /dev/stdout",  # start-fg's output: the log file below
        *encrypted,
        "",
    ])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def postfix(routes: Mapping[str, int], tls: Certificate | None = None) -> Iterator[Postfix]:
    """Postfix relaying each domain of `routes` to that loopback port until the block
    ends; mail for any other domain is deferred."""
    reason = unavailable()
    if reason is not None:
        raise RuntimeError(reason)
    with tempfile.TemporaryDirectory(prefix="postrelay-postfix-") as name:
        folder = Path(name)
        folder.chmod(0o755)
        yield from _running(find_postfix() or "postfix", folder, routes, tls)


def _running(binary: str, folder: Path, routes: Mapping[str, int],
             tls: Certificate | None) -> Iterator[Postfix]:
    conf = folder / "conf"
    for path in (conf, folder / "queue", folder / "data"):
        path.mkdir(parents=True, exist_ok=True)
    shutil.chown(folder / "data", "postfix")  # the master's lock file, the TLS caches
    if tls is not None:  # read by the daemons as root, before they drop privileges
        (folder / "tls").mkdir()
        (folder / "tls" / "cert.pem").write_bytes(tls.cert_pem)
        (folder / "tls" / "key.pem").write_bytes(tls.key_pem)
        (folder / "tls" / "key.pem").chmod(0o600)
    port = _free_port()
    (conf / "main.cf").write_text(_main_cf(folder, routes, tls))
    (conf / "master.cf").write_text(MASTER_CF.format(port=port))
    # Creates the queue's folders with the owners and modes the daemons expect.
    subprocess.run([binary, "-c", str(conf), "check"], check=True, timeout=60)
    log_path = folder / "postfix.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([binary, "-c", str(conf), "start-fg"],
                                   stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT)
    relay = Postfix(port, log_path, process)
    try:
        _wait_listening(relay)
        yield relay
    finally:
        subprocess.run([binary, "-c", str(conf), "stop"], timeout=60,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _wait_listening(relay: Postfix) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECS
    while True:
        if relay.process.poll() is not None:
            raise RuntimeError(f"postfix exited at start:\n{relay.log()}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", relay.port)) == 0:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"postfix did not listen within {START_TIMEOUT_SECS:g} s:\n"
                               f"{relay.log()}")
        time.sleep(0.05)
