"""The README's first command: `postrelay demo` settles every job and shows the DLQ."""

import subprocess
import sys
from pathlib import Path

POSTRELAY = str(Path(sys.executable).parent / "postrelay")


def test_demo_runs_to_settled_and_reports(worker_env, clean_db):
    done = subprocess.run([POSTRELAY, "demo"], env=worker_env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "jobs by status: pending=0, running=0, done=26, failed=0, dlq=1" in out
    assert "failed at first and succeeded on a retry" in out
    assert "virus_scan attempts=3/3" in out
    assert "RuntimeError: signature database unavailable" in out
