"""`postrelay api` and `postrelay keys` as an operator runs them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from postrelay.access.keys import api_key_create, api_key_find, api_key_list, api_key_revoke
from postrelay.core.errors import ConflictError, NotFoundError, ValidationError

POSTRELAY = str(Path(sys.executable).parent / "postrelay")
CLI_KEY = "cli-test-key-" + "k" * 32


def run(env, *args):
    return subprocess.run([POSTRELAY, *args], env=env, capture_output=True, text=True, timeout=60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serving(env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """`postrelay api` on a free loopback port, once it answers: the process and its URL."""
    port = free_port()
    proc = subprocess.Popen([POSTRELAY, "api", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "postrelay api did not come up"
        time.sleep(0.1)


def test_api_refuses_to_start_without_a_key(worker_env):
    env = {k: v for k, v in worker_env.items() if k != "POSTRELAY_SERVICE_ROLE_KEY"}
    result = run(env, "api", "--port", str(free_port()))
    assert result.returncode == 2
    assert "POSTRELAY_SERVICE_ROLE_KEY is not set" in result.stderr


def test_api_refuses_to_start_with_a_short_key(worker_env):
    """Issue 18: any key length was accepted (`POSTRELAY_SERVICE_ROLE_KEY=a` started)."""
    for key in ("a", "x" * 31):
        result = run({**worker_env, "POSTRELAY_SERVICE_ROLE_KEY": key}, "api", "--port",
                     str(free_port()))
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [
            f"error: POSTRELAY_SERVICE_ROLE_KEY must be at least 32 characters long (it has "
            f"{len(key)}); generate one with python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'"]


@pytest.mark.parametrize("host", ["no-such-host.invalid", "a b", "a" * 70])
def test_a_host_that_names_no_address_is_refused_by_name(worker_env, host):
    """uvicorn found it out after the app had started: "ERROR: [Errno -2] Name or service
    not known" among its log lines, exit 3."""
    env = {**worker_env, "POSTRELAY_SERVICE_ROLE_KEY": CLI_KEY}
    result = run(env, "api", "--host", host, "--port", str(free_port()))
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert result.stderr.startswith(f"error: --host: cannot listen on {host!r}: "), result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_a_port_taken_is_refused_naming_the_address(worker_env):
    """uvicorn started the app, logged "[Errno 98] error while attempting to bind on address
    ('127.0.0.1', 8000): address already in use" among its lines, and exited 3."""
    env = {**worker_env, "POSTRELAY_SERVICE_ROLE_KEY": CLI_KEY}
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run(env, "api", "--host", "127.0.0.1", "--port", str(port))
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert result.stderr.splitlines() == [
        f"error: --host and --port: cannot listen on 127.0.0.1:{port}: Address already in use"
    ], result.stderr


def test_api_serves_on_host_and_port(worker_env, clean_db):
    proc, base = serving({**worker_env, "POSTRELAY_SERVICE_ROLE_KEY": CLI_KEY})
    try:
        assert httpx.get(f"{base}/readyz").status_code == 200
        listed = httpx.get(f"{base}/v1/functions/jobs", headers={"apikey": CLI_KEY})
        assert listed.json() == {"data": [], "meta": None}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_behind_a_proxy_network_clients_are_told_apart_by_x_forwarded_for(worker_env,
                                                                          clean_db):
    """The proxy named by its network: each client's wrong keys count for that client,
    as its X-Forwarded-For names it, not for the proxy's address they all share."""
    env = {**worker_env, "POSTRELAY_SERVICE_ROLE_KEY": CLI_KEY,
           "POSTRELAY_API_FORWARDED_ALLOW_IPS": "127.0.0.0/8",
           "POSTRELAY_AUTH_FAILURES_PER_CLIENT": "2"}
    proc, base = serving(env)
    try:
        def wrong_key(client: str, n: int) -> int:
            return httpx.get(f"{base}/v1/functions/jobs", headers={
                "apikey": f"wrong-{n}-" + "w" * 32, "X-Forwarded-For": client}).status_code

        assert [wrong_key("203.0.113.5", n) for n in range(3)] == [401, 401, 429]
        assert wrong_key("198.51.100.9", 0) == 401
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_keys_add_list_revoke(worker_env, engine, tenant):
    added = run(worker_env, "keys", "add", "billing", "--tenant", str(tenant))
    assert added.returncode == 0, added.stderr
    key = added.stdout.strip()
    assert len(key) >= 43 and "not shown again" in added.stderr
    with engine.connect() as conn:
        assert api_key_find(conn, key) == ("billing", tenant)
    listed = run(worker_env, "keys", "list", "--json")
    (entry,) = json.loads(listed.stdout)
    assert entry["name"] == "billing" and entry["tenant_id"] == str(tenant)
    assert entry["revoked_at"] is None and key not in listed.stdout
    revoked = run(worker_env, "keys", "revoke", "billing")
    assert revoked.returncode == 0 and "revoked billing" in revoked.stdout
    with engine.connect() as conn:
        assert api_key_find(conn, key) is None
        assert api_key_list(conn)[0].revoked_at is not None


def test_key_rules(engine, tenant):
    with engine.begin() as conn:
        view, key = api_key_create(conn, "billing", tenant_id=tenant, actor="test:ops")
        assert view.name == "billing" and api_key_find(conn, key) == ("billing", tenant)
        with pytest.raises(ConflictError, match="already exists"):
            api_key_create(conn, "billing", tenant_id=tenant, actor="test:ops")
    for name, tenant_id, field in [("has space", tenant, "name"), ("x", "acme", "tenant_id"),
                                   ("x", uuid.UUID(int=0xBEEF), "tenant_id")]:
        with engine.begin() as conn, pytest.raises(ValidationError) as info:
            api_key_create(conn, name, tenant_id=tenant_id, actor="test:ops")
        assert info.value.field == field
    with engine.begin() as conn, pytest.raises(NotFoundError, match="no API key named 'nobody'"):
        api_key_revoke(conn, "nobody", actor="test:ops")


def test_a_key_name_with_a_trailing_newline_or_a_byte_not_utf8_is_refused(worker_env, tenant):
    """`$` matched before a final newline, so `keys add $'billing\\n'` stored a name that
    split audit rows and log lines; revoking a name that was not UTF-8 ended in
    "unexpected UnicodeEncodeError"."""
    added = run(worker_env, "keys", "add", "billing\n", "--tenant", str(tenant))
    assert added.returncode == 1 and added.stdout == "", added.stderr
    assert added.stderr.startswith("error: NAME: 1-128 characters"), added.stderr
    assert json.loads(run(worker_env, "keys", "list", "--json").stdout) == []
    revoked = run(worker_env, "keys", "revoke", "billing\udcff")
    assert revoked.returncode == 1 and "Traceback" not in revoked.stderr
    assert revoked.stderr.startswith("error: NAME: must not contain an unpaired surrogate")


def test_a_key_cannot_be_bound_to_the_system_tenant(worker_env, clean_db):
    """It was made: a key that could pause or cancel postrelay's own jobs (retention,
    maintenance) for every tenant."""
    added = run(worker_env, "keys", "add", "sys", "--tenant", str(uuid.UUID(int=0)))
    assert added.returncode == 1 and added.stdout == "", added.stderr
    assert added.stderr.startswith("error: --tenant: the system tenant runs postrelay's own")
    assert json.loads(run(worker_env, "keys", "list", "--json").stdout) == []


def test_keys_add_and_revoke_record_who_did_it(worker_env, engine, tenant):
    """A key opens a tenant's data: its row kept when it was made and revoked, but not by
    whom, and no other audit row named the actor either."""
    assert run(worker_env, "keys", "add", "billing", "--tenant", str(tenant)).returncode == 0
    assert run(worker_env, "keys", "revoke", "billing").returncode == 0
    assert run(worker_env, "keys", "revoke", "billing").returncode == 0  # the first stays
    (entry,) = json.loads(run(worker_env, "keys", "list", "--json").stdout)
    assert entry["created_by"].startswith("cli:") and entry["revoked_by"].startswith("cli:")
    table = run(worker_env, "keys", "list").stdout.splitlines()
    assert table[0].split() == ["NAME", "TENANT", "CREATED_AT", "CREATED_BY", "REVOKED_AT",
                                "REVOKED_BY"]
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_api_key SET revoked_by = 'cli:first@host'"))
    run(worker_env, "keys", "revoke", "billing")
    (entry,) = json.loads(run(worker_env, "keys", "list", "--json").stdout)
    assert entry["revoked_by"] == "cli:first@host"
