"""`postrelay pause`, `resume` and the pauses in `status`, as the real console script."""

import json
import uuid

from sqlalchemy import text

from tests.factories import insert_throttle
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
    cases = [(["pause", "--kind", "nope"], "--kind: unknown job kind 'nope'"),
             (["pause", "--tenant", str(uuid.uuid4())], "--tenant: unknown tenant"),
             (["pause"], "scope: give a kind"),
             (["pause", "--all", "--kind", "reindex"], "--all: pauses every job"),
             (["resume", "--kind", "reindex"], "not paused: kind reindex")]
    for args, message in cases:
        done = run(worker_env, *args, ok=False)
        assert done.returncode == 1 and message in done.stderr, (args, done.stderr)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job_pause")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_flow_audit")).scalar_one() == 0


def test_limits_set_list_rm(worker_env, engine, tenant):
    out = run(worker_env, "limits", "set", "--kind", "email_send", "--rate", "14/s",
              "--concurrency", "20", "--key", "domain").stdout
    assert out.strip() == ("limit set: kind email_send, per domain: 14/s (burst 14), "
                           "at most 20 running")
    run(worker_env, "limits", "set", "--kind", "email_send", "--tenant", str(tenant),
        "--rate", "600/min", "--burst", "3")
    table = run(worker_env, "limits", "list").stdout.splitlines()
    assert table[0].split() == ["KIND", "TENANT", "KEY", "RATE", "BURST", "CONCURRENCY", "BY",
                                "SINCE"]
    assert table[1].split()[:6] == ["email_send", "(every", "tenant)", "domain", "14/s", "14"]
    assert table[2].split()[:5] == ["email_send", str(tenant), "-", "10/s", "3"]
    listed = json.loads(run(worker_env, "limits", "list", "--json").stdout)
    assert [lim["key_path"] for lim in listed] == [["domain"], None]
    run(worker_env, "limits", "rm", "--kind", "email_send")
    assert len(json.loads(run(worker_env, "limits", "list", "--json").stdout)) == 1
    for args, message in ((["--rate", "0/s"], "rate: must be more than 0"),
                          (["--rate", "lots"], "rate: must be a number per s"),
                          (["--concurrency", "0"], "concurrency: must be a whole number")):
        done = run(worker_env, "limits", "set", "--kind", "reindex", *args, ok=False)
        assert done.returncode == 1 and message in done.stderr, done.stderr
    gone = run(worker_env, "limits", "rm", "--kind", "reindex", ok=False)
    assert gone.returncode == 1 and "no limit for kind reindex" in gone.stderr


def test_limits_list_shows_throttled_destinations(worker_env, engine, tenant):
    assert run(worker_env, "limits", "list", "--throttled").stdout.strip() == (
        "no destination is throttled")
    with engine.begin() as conn:
        insert_throttle(conn, kind="outbox_dispatch", key_path=["endpoint_id"], key="ep-1",
                        tenant_id=tenant, reason="HTTP 503", ceiling=None, paused_secs=0,
                        rate=2.0)
    out = run(worker_env, "limits", "list").stdout
    assert out.startswith("no limits") and "throttled (refused by the destination" in out
    row = [line for line in out.splitlines() if "endpoint_id=ep-1" in line][0]
    destination, key, rate_now, back_to = row.split()[:4]
    assert (destination, key, back_to) == ("outbox_dispatch", "endpoint_id=ep-1", "unlimited")
    assert float(rate_now.removesuffix("/s")) >= 2.0  # from 2/s, doubling every 10 s
    assert row.rstrip().endswith("HTTP 503")
    [listed] = json.loads(run(worker_env, "limits", "list", "--throttled", "--json").stdout)
    assert (listed["kind"], listed["key"], listed["reason"]) == ("outbox_dispatch", "ep-1",
                                                                 "HTTP 503")


def test_pausing_what_a_tenant_key_paused_makes_it_the_operators(worker_env, engine, tenant):
    """`already paused ... (by api:key:acme-app)` left the pause the key's to lift, the
    operator's pause notwithstanding."""
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO mdm.aa_job_pause (tenant_id, job_kind, paused_by) "
                          "VALUES (:t, 'email_send', 'api:key:acme-app')"), {"t": tenant})
    out = run(worker_env, "pause", "--kind", "email_send", "--tenant", str(tenant)).stdout
    assert out.startswith("already paused kind email_send") and "(by cli:" in out, out
    with engine.connect() as conn:
        assert conn.execute(text("SELECT paused_by FROM mdm.aa_job_pause")).scalar_one() \
            .startswith("cli:")
        audit = conn.execute(text("SELECT action, actor, detail FROM mdm.aa_flow_audit")).one()
    assert audit.action == "paused" and audit.actor.startswith("cli:")
    assert audit.detail["taken_over_from"] == "api:key:acme-app"
