"""Several copies of one command, each a child process, started and stopped together: what
`postrelay inbound --processes N` runs (N receivers sharing one port).

    status = run_copies("inbound", [sys.executable, "-m", "postrelay", "inbound", "--reuse-port"],
                        4, stop)

They run until `stop` is set (the parent's SIGTERM or SIGINT) or one of them ends. One
that ends by itself -- a crash, a kill, a database it cannot use at start -- ends them all,
and its status is the parent's: a service manager then restarts the whole set, rather than
a set that runs short of a process without anyone seeing it.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading

from postrelay.core.telemetry import event

GRACE_SECS = 30.0  # a copy still running this long after SIGTERM is killed
POLL_SECS = 0.2


def run_copies(command: str, argv: list[str], copies: int, stop: threading.Event) -> int:
    """Run `copies` processes of `argv` until `stop` is set or one ends; stop the others
    (SIGTERM, then SIGKILL after GRACE_SECS). The exit status: 0 when stopped, else that of
    the copy that ended first (128 + the signal for one killed by a signal, as a shell says
    it), which is logged as `postrelay.<command>.process_ended`."""
    children = [subprocess.Popen(argv) for _ in range(copies)]
    status = 0
    try:
        while not stop.wait(POLL_SECS):
            ended = next((c for c in children if c.poll() is not None), None)
            if ended is not None:
                status = _status(ended.returncode)
                # 0: it was asked to stop (a terminal's Ctrl-C reaches every process).
                event(f"postrelay.{command}.process_ended",
                      logging.ERROR if status else logging.INFO, pid=ended.pid,
                      status=status, stopping=copies - 1)
                break
    finally:
        _stop(children)
    return status


def _stop(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(GRACE_SECS)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode
