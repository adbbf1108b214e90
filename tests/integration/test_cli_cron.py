"""`postrelay cron add|list|rm` as an operator runs them."""

import json
import subprocess
import sys
from pathlib import Path

POSTRELAY = str(Path(sys.executable).parent / "postrelay")


def run(env, *args):
    return subprocess.run([POSTRELAY, *args], env=env, capture_output=True, text=True, timeout=60)


def test_cron_add_list_rm(worker_env, tenant):
    added = run(worker_env, "cron", "add", "nightly-cleanup", "*/1 * * * *", "bulk_import",
                "--payload", '{"dryRun": false}', "--tenant", str(tenant))
    assert added.returncode == 0, added.stderr
    assert "'0 */1 * * * *'" in added.stdout
    listed = run(worker_env, "cron", "list", "--json", "--tenant", str(tenant))
    (entry,) = json.loads(listed.stdout)
    assert entry["name"] == "nightly-cleanup" and entry["payload"] == {"dryRun": False}
    assert entry["last_run"] is None and entry["next_run"] is None
    assert run(worker_env, "cron", "rm", "nightly-cleanup").returncode == 0
    gone = run(worker_env, "cron", "rm", "nightly-cleanup")
    assert gone.returncode == 1 and "no cron entry named 'nightly-cleanup'" in gone.stderr


def test_cron_add_refuses_aliases_with_the_format(worker_env, tenant):
    refused = run(worker_env, "cron", "add", "daily", "@daily", "reindex", "--tenant", str(tenant))
    assert refused.returncode == 1
    assert "SCHEDULE:" in refused.stderr and "expected 5 fields" in refused.stderr


def test_cron_names_per_tenant_and_the_reserved_ones(worker_env, tenant, engine):
    from postrelay.queue import ensure_tenant

    with engine.begin() as conn:
        other = ensure_tenant(conn, "other")
    for owner in (tenant, other):
        added = run(worker_env, "cron", "add", "nightly", "0 3 * * *", "reindex",
                    "--tenant", str(owner))
        assert added.returncode == 0, added.stderr
    listed = run(worker_env, "cron", "list")
    assert str(tenant) in listed.stdout and str(other) in listed.stdout
    ambiguous = run(worker_env, "cron", "rm", "nightly")
    assert ambiguous.returncode == 1
    assert "2 tenants have a cron entry named 'nightly': name the tenant" in ambiguous.stderr
    assert run(worker_env, "cron", "rm", "nightly", "--tenant", str(other)).returncode == 0
    entries = json.loads(run(worker_env, "cron", "list", "--json").stdout)
    assert [e["tenant_id"] for e in entries if e["name"] == "nightly"] == [str(tenant)]

    reserved = run(worker_env, "cron", "add", "postrelay.mine", "0 3 * * *", "reindex")
    assert reserved.returncode == 1 and "reserved for the system" in reserved.stderr
    builtin = run(worker_env, "cron", "rm", "postrelay.retention")
    assert builtin.returncode == 1 and "reserved for the system" in builtin.stderr
    system_kind = run(worker_env, "cron", "add", "sweep", "0 3 * * *", "cleanup_jobs",
                      "--tenant", str(tenant))
    assert system_kind.returncode == 1 and "runs only in the system tenant" in system_kind.stderr


def test_cron_add_checks_an_email_send_payload_as_enqueue_email_does(worker_env, tenant):
    refused = run(worker_env, "cron", "add", "digest", "0 8 * * *", "email_send", "--payload",
                  '{"template": "welcome", "to": ["not an address"]}', "--tenant", str(tenant))
    assert refused.returncode == 1 and "--payload (payload.to[0]):" in refused.stderr
    listed = run(worker_env, "cron", "list", "--json", "--tenant", str(tenant))
    assert json.loads(listed.stdout) == []
    added = run(worker_env, "cron", "add", "digest", "0 8 * * *", "email_send", "--payload",
                '{"template": "welcome", "to": ["ann@x.example"]}', "--tenant", str(tenant))
    assert added.returncode == 0, added.stderr
