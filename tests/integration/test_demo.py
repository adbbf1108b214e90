"""The README's first command: `postrelay demo` runs the whole flow — jobs, outbox events,
relay, worker, SMTP — until everything settles, and reports it."""

import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import text

from postrelay.core.migrate import upgrade
from tests.migrations import pretend_migrated_by_a_newer_postrelay, throwaway_database

POSTRELAY = str(Path(sys.executable).parent / "postrelay")


def run_demo(env: dict[str, str]) -> str:
    done = subprocess.run([POSTRELAY, "demo"], env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_demo_runs_the_whole_flow_to_settled_and_reports(worker_env, clean_db, tmp_path):
    env = {**worker_env, "POSTRELAY_EMBEDDED_DATA_DIR": str(tmp_path / "pgdata")}
    out = run_demo(env)
    # 27 background jobs (one dead-letters) and 22 messages of 24 events for three tenants.
    assert "jobs by status: pending=0, running=0, done=44, failed=0, dlq=5" in out
    assert "email_send   dlq=4, done=18" in out
    assert "email log by outcome: bounced=3, failed=1, partial=3, sent=15" in out
    assert "550 5.1.1 No such user here" in out
    assert "554 5.7.1" not in out.split("dead-letter queue")[1]  # partly delivered, done
    assert "ap@blocked.example refused with 554 5.7.1" in out
    assert "undefined variable: 'stats' is undefined" in out
    assert "virus_scan attempts=3/3" in out
    assert ("3 reports came back later (2 DSNs to their VERP addresses, a complaint), "
            "through an inbound listener") in out
    maildir = tmp_path / "demo-mail"
    assert f"the SMTP sink received 18 messages; read them in the Maildir {maildir}" in out
    assert len(list((maildir / "new").iterdir())) == 18
    # Later, through the inbound listener: a DSN to a VERP address bounces a `sent` row and
    # suppresses the address; a complaint does too; a delay only marks the row.
    feedback = out.split("feedback after the SMTP handoff (3):")[1].split("dead-letter")[0]
    lines = [" ".join(line.split()) for line in feedback.strip().splitlines()]
    assert lines == [
        "sent → bounced acme welcome user4@acme.example: bounced (mail) 5.1.1 smtp; 550 "
        "5.1.1 <user4@acme.example>: mailbox deleted; address suppressed",
        "sent → complained globex welcome user3@globex.example: complaint (mail); address "
        "suppressed",
        "sent → delayed initech welcome user4@initech.example: delayed (mail) 4.2.2 smtp; "
        "452 4.2.2 <user4@initech.example>: mailbox full"]

    # Run again: the addresses that bounced with 5.1.1, at once or later, and the one that
    # complained are now suppressed, not tried.
    again = run_demo(env)
    assert "email log by outcome: failed=1, partial=3, sent=13, suppressed=5" in again
    assert "feedback after the SMTP handoff (1):" in again
    # Only the full mailbox's DSN came back: the line said "1 reports came back later (DSNs
    # to the VERP addresses, a complaint)".
    assert ("1 report came back later (a DSN to its VERP address), through an inbound "
            "listener") in again


def test_demo_interrupted_halfway_leaves_nothing_claimed_and_runs_again(
        worker_env, clean_db, engine, tmp_path):
    """Ctrl-C while the worker runs: the demo stops (exit 130, no traceback), hands back
    what it had claimed instead of leaving it `running` for a lease, and runs again."""
    env = {**worker_env, "POSTRELAY_EMBEDDED_DATA_DIR": str(tmp_path / "pgdata")}
    demo = subprocess.Popen([POSTRELAY, "demo"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            if line.startswith("enqueued"):  # the relay and the worker start now
                break
        time.sleep(0.3)
        demo.send_signal(signal.SIGINT)
        _, stderr = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate()
    assert demo.returncode == 130, stderr
    assert "Traceback" not in stderr
    with engine.connect() as conn:
        assert conn.execute(text(
            "SELECT count(*) FROM mdm.aa_job WHERE status = 'running'")).scalar_one() == 0
    again = run_demo(env)
    assert "jobs by status: pending=0, running=0, " in again


def test_demo_on_a_database_a_newer_postrelay_migrated_says_so(worker_env, server_url):
    """The demo migrates first, and alembic said only "unexpected CommandError: Can't
    locate revision identified by '0999'"."""
    with throwaway_database(server_url) as url:
        upgrade(url, "0010")
        pretend_migrated_by_a_newer_postrelay(url)
        done = subprocess.run([POSTRELAY, "demo"],
                              env={**worker_env, "POSTRELAY_DATABASE_URL": url},
                              capture_output=True, text=True, timeout=180)
    assert done.returncode == 1 and done.stdout == "", done.stdout
    assert done.stderr.startswith("error: the database is at migration 0999, which this "
                                  "postrelay does not have"), done.stderr
