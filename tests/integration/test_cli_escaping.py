"""Stored fields reach the operator's terminal escaped: a tenant (or an SMTP server, or a
webhook receiver) that writes control characters, ESC sequences or bidi overrides into a
field cannot drive or reorder the terminal through any command that prints it. `--json`
output stays valid JSON that gives back the stored value."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from tests.dashboard.conftest import insert_email, insert_event
from tests.factories import insert_job
from tests.integration.test_cli_admin import run

# A title change, a screen clear, a right-to-left override, a C1 CSI, DEL, a carriage return.
EVIL = "\x1b]0;pwned\x07\x1b[2J\u202egnp.exe\x9b31m\x7f\rfake\u2066"
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def evil_rows(engine, tenant):
    """One row of every kind an operator command prints, each with EVIL in its text."""
    now = datetime.now(UTC)
    with engine.begin() as conn:
        job_id = insert_job(conn, tenant_id=tenant, status="dlq", attempts=8, max_attempts=8,
                            completed_at=now, last_error=f"Traceback\nValueError: {EVIL}",
                            idempotency_key=EVIL, payload={"note": EVIL})
        event_id = insert_event(conn, tenant, event_type=f"order.{EVIL}", aggregate_id=EVIL,
                                dead_at=now, last_error=EVIL, attempts=10)
        log_id = insert_email(conn, tenant, job_id=job_id, event_id=event_id, subject=EVIL,
                              from_address=f"{EVIL} <a@example.com>", smtp_response=EVIL,
                              error=EVIL, recipients=[f"{EVIL}@example.com"], status="failed")
        endpoint_id = conn.execute(text(
            "INSERT INTO mdm.aa_webhook_endpoint (tenant_id, url, secret, enabled,"
            " disabled_reason, disabled_by) VALUES (:t, :url, 'whsec_x', false, :evil,"
            " 'operator') RETURNING id"),
            {"t": tenant, "url": f"https://example.com/{EVIL}", "evil": EVIL}).scalar_one()
        conn.execute(text(
            "INSERT INTO mdm.aa_webhook_attempt (endpoint_id, event_id, attempt, status_code,"
            " duration_ms, response_body) VALUES (:e, :ev, 1, 500, 3, :evil)"),
            {"e": endpoint_id, "ev": event_id, "evil": EVIL})
        conn.execute(text(
            "INSERT INTO mdm.aa_cron_entry (name, tenant_id, schedule, job_kind, payload)"
            " VALUES ('evil', :t, '0 0 * * * *', 'reindex', CAST(:p AS jsonb))"),
            {"t": tenant, "p": json.dumps({"note": EVIL})})
    return {"job": str(job_id), "log": str(log_id), "event": str(event_id)}


def assert_escaped(output: str) -> None:
    assert not RAW.search(output), repr(RAW.search(output))
    assert "\\x1b" in output or "\\u001b" in output, output


def test_every_command_that_prints_stored_fields_escapes_them(worker_env, evil_rows):
    commands = [
        ("jobs", "show", evil_rows["job"]),
        ("jobs", "list"),
        ("dlq", "list"),
        ("emails",),
        ("emails", "show", evil_rows["log"]),
        ("outbox", "status"),
        ("webhooks", "list"),
        ("webhooks", "attempts"),
        ("cron", "list"),
    ]
    for args in commands:
        done = run(worker_env, *args)
        assert_escaped(done.stdout)
        assert not RAW.search(done.stderr), (args, done.stderr)


def test_json_output_stays_valid_and_gives_back_the_stored_value(worker_env, evil_rows):
    job = json.loads(run(worker_env, "jobs", "show", evil_rows["job"], "--json").stdout)
    assert job["idempotency_key"] == EVIL and job["payload"] == {"note": EVIL}
    for args in (("jobs", "list"), ("dlq", "list"), ("emails",), ("webhooks", "attempts"),
                 ("outbox", "status"), ("emails", "show", evil_rows["log"]), ("cron", "list")):
        done = run(worker_env, *args, "--json")
        assert_escaped(done.stdout)
        assert any(EVIL in value for value in strings(json.loads(done.stdout))), args


def strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def test_an_error_naming_a_stored_or_typed_value_is_escaped(worker_env, clean_db):
    done = run(worker_env, "cron", "rm", f"nope{EVIL}", ok=False)
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1
    assert not RAW.search(done.stderr.rstrip("\n")), repr(done.stderr)


@pytest.mark.parametrize("extra", [(), ("--category", f"news{EVIL}")])
def test_an_error_that_repeats_a_typed_address_is_escaped(worker_env, tenant, extra):
    """The errors of the commands that run in one transaction (cli/common.py) were printed
    as they came: `emails unsuppress` of an address that is not suppressed wrote the
    address's bidi override and ESC sequences to the terminal."""
    done = run(worker_env, "emails", "unsuppress", f"ann{EVIL}@example.com", "--tenant",
               str(tenant), *extra, ok=False)
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1
    assert not RAW.search(done.stderr.rstrip("\n")), repr(done.stderr)
