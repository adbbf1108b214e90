"""`postrelay feedback ingest -` on a message larger than POSTRELAY_INBOUND_MAX_BYTES: read
through, never held whole, and recorded as the receiver's parser records one past its
bound: an `unparsed` report with the message's headers kept."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

from tests.feedback.conftest import BOUNCE_DOMAIN, SECRET
from tests.feedback.test_ingest_cli import POSTRELAY, run

HEAD = (b"From: MAILER-DAEMON@mx.example.net\r\nTo: bounce-x@" + BOUNCE_DOMAIN.encode()
        + b"\r\nSubject: Undelivered Mail Returned to Sender\r\n"
          b"Message-ID: <huge-1@mx.example.net>\r\n\r\n")
BODY_BYTES = 256 * 1024 * 1024
CHUNK = b"x" * 1023 + b"\n"
BOUND = 1024 * 1024


def ingest_stdin(env: dict[str, str], tmp_path) -> tuple[int, int, str]:
    """Exit status, peak resident memory (KiB) and output of `feedback ingest -` fed HEAD
    and BODY_BYTES of body."""
    out = tmp_path / "ingest.out"
    with out.open("wb") as stdout:
        proc = subprocess.Popen([str(POSTRELAY), "feedback", "ingest", "-"], env=env,
                                stdin=subprocess.PIPE, stdout=stdout, stderr=subprocess.STDOUT)

    def feed() -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(HEAD)
            for _ in range(BODY_BYTES // len(CHUNK)):
                proc.stdin.write(CHUNK)
        except BrokenPipeError:  # it stopped reading: the status says why
            pass
        finally:
            proc.stdin.close()

    writer = threading.Thread(target=feed)
    writer.start()
    # The process's own peak (VmHWM), read until it ends: wait4's ru_maxrss also counts the
    # children it waited for, such as an embedded PostgreSQL it started and stopped.
    peak_kib = 0
    while proc.poll() is None:
        peak_kib = max(peak_kib, _own_peak_kib(proc.pid))
        time.sleep(0.01)
    writer.join()
    return proc.returncode, peak_kib, out.read_text()


def _own_peak_kib(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # ended meanwhile
        return 0
    found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    return int(found.group(1)) if found else 0


def test_a_message_past_the_bound_on_stdin_is_recorded_unparsed_without_holding_it(
        worker_env, look, tmp_path):
    """The whole of stdin was read into memory, then copied to hash it: 256 MiB of body
    took over half a gigabyte, where the receiver refuses a message past the bound."""
    env = {**worker_env, "POSTRELAY_EMAIL_BOUNCE_DOMAIN": BOUNCE_DOMAIN,
           "POSTRELAY_FEEDBACK_SECRET": SECRET.decode(),
           "POSTRELAY_INBOUND_MAX_BYTES": str(BOUND)}
    code, peak_kib, output = ingest_stdin(env, tmp_path)
    assert code == 0, output
    assert "\nstdin: feedback " in f"\n{output}", output
    assert peak_kib < BODY_BYTES // 1024, f"peak {peak_kib // 1024} MiB"
    (row,) = look.feedback()
    assert row["kind"] == "unparsed"
    size = len(HEAD) + BODY_BYTES // len(CHUNK) * len(CHUNK)
    assert row["detail"]["reason"] == (f"{size} bytes, over the {BOUND}-byte limit; "
                                       "headers kept")
    assert "Undelivered Mail Returned to Sender" in json.dumps(row["detail"]["headers"])
    # The same message again is the same report.
    code, _, output = ingest_stdin(env, tmp_path)
    assert code == 0 and "\nstdin: already recorded\n" in f"\n{output}", output
    assert run(env, "feedback", "list", "--kind", "unparsed").stdout.count(b"unparsed") == 1


def test_the_digest_read_in_pieces_is_the_digest_of_the_whole():
    """A message past the bound is known by the same digest as one read whole, so the same
    message is one report however it came; CRLF and the final newlines may fall across
    any two pieces."""
    from postrelay.orchestrator.feedback.cut import StreamDigest
    from postrelay.orchestrator.feedback.parse import _digest

    for raw in (b"a\r\nb\r\n\r\n", b"a\r\r\nb\n\n\r", b"\r\n\r\n", b"x\n\nx\r", b"",
                b"From x\r\n\r\nbody\r\n\n\n"):
        for at in range(len(raw) + 1):
            for again in range(at, len(raw) + 1):
                digest = StreamDigest()
                for piece in (raw[:at], raw[at:again], raw[again:]):
                    digest.update(piece)
                assert digest.hexdigest() == _digest(raw), (raw, at, again)
