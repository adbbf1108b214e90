"""`postrelay pause`, `resume` and the pauses in `status`, as the real console script."""

import json
import uuid

from sqlalchemy import text

from tests.integration.test_cli_admin import run


def test_pause_shows_in_status_and_resume_lifts_it(worker_env, engine, tenant):
    out = run(worker_env, "pause", "--kind", "email_send", "--tenant", str(tenant)).stdout
    assert out.strip() == f"paused kind email_send, tenant {tenant}"
    again = run(worker_env, "pause", "--kind", "email_send", "--tenant", str(tenant)).stdout
    assert again.startswith("already paused kind email_send") and "by cli:" in again
    run(worker_env, "pause", "--all")

    status = run(worker_env, "status").stdout
    paused = status.split("PAUSED")[1].splitlines()[2:]
    assert paused[0].split()[:2] == ["email_send", "acme"] and "cli:" in paused[0]
    assert paused[1].split()[:2] == ["(every", "kind)"] and "(every tenant)" in paused[1]
    listed = json.loads(run(worker_env, "status", "--json").stdout)["paused"]
    assert [(p["kind"], p["tenant_id"]) for p in listed] == [
        ("email_send", str(tenant)), (None, None)]

    assert run(worker_env, "resume", "--all").stdout.startswith("resumed every kind, every")
    run(worker_env, "resume", "--kind", "email_send", "--tenant", str(tenant))
    assert "PAUSED" not in run(worker_env, "status").stdout
    with engine.connect() as conn:
        actions = conn.execute(text("SELECT action FROM mdm.aa_flow_audit ORDER BY id")).all()
    assert [a for (a,) in actions] == ["paused", "paused", "resumed", "resumed"]


def test_bad_input_is_one_line_naming_the_field_and_nothing_is_written(worker_env, engine,
                                                                      tenant):
    cases = [(["pause", "--kind", "nope"], "kind: unknown job kind 'nope'"),
             (["pause", "--tenant", str(uuid.uuid4())], "tenant_id: unknown tenant"),
             (["pause"], "scope: give a kind"),
             (["pause", "--all", "--kind", "reindex"], "all: pauses every job"),
             (["resume", "--kind", "reindex"], "not paused: kind reindex")]
    for args, message in cases:
        done = run(worker_env, *args, ok=False)
        assert done.returncode == 1 and message in done.stderr, (args, done.stderr)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job_pause")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_flow_audit")).scalar_one() == 0
