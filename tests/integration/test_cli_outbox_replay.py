"""`postrelay outbox replay` as an operator runs it after an incident: `--dead` picks the
events the relay gave up on, anything but one `--event` asks first (on a real terminal, a
pty), a script without `--yes` is refused with nothing replayed, and every replay leaves
its log line."""

from __future__ import annotations

import os
import subprocess
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from postrelay.queue import ensure_tenant
from tests.dashboard.conftest import insert_event
from tests.integration.test_cli_admin import POSTRELAY


@pytest.fixture
def events(engine, tenant) -> dict[str, uuid.UUID]:
    """Two dead events and a handled one of acme's, a dead one of globex's."""
    now = datetime.now(UTC)
    with engine.begin() as conn:
        globex = ensure_tenant(conn, "globex")
        dead = {"dead_at": now, "attempts": 10, "last_error": "route broke"}
        return {
            "acme_dead_old": insert_event(conn, tenant, created_at=now - timedelta(days=2),
                                          **dead),
            "acme_dead_new": insert_event(conn, tenant, **dead),
            "acme_handled": insert_event(conn, tenant, handled_at=now),
            "globex_dead": insert_event(conn, globex, **dead),
        }


def states(engine) -> dict[uuid.UUID, str]:
    with engine.connect() as conn:
        return dict(conn.execute(text(
            "SELECT id, CASE WHEN handled_at IS NOT NULL THEN 'handled' "
            "WHEN dead_at IS NOT NULL THEN 'dead' ELSE 'pending' END "
            "FROM mdm.aa_outbox_event")).all())


def replay(env, *args: str) -> subprocess.CompletedProcess[str]:
    """Run from a script: stdin is not a terminal."""
    return subprocess.run([str(POSTRELAY), "outbox", "replay", *args], env=env, text=True,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=60)


def replay_on_a_terminal(env, answer: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run with a pseudo-terminal as stdin, the answer typed ahead."""
    leader, follower = os.openpty()
    try:
        with subprocess.Popen([str(POSTRELAY), "outbox", "replay", *args], env=env,
                              stdin=follower, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) as proc:
            os.close(follower)
            os.write(leader, answer.encode())
            out, err = proc.communicate(timeout=60)
    finally:
        os.close(leader)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_script_without_yes_replays_nothing(worker_env, engine, events):
    """A range replay ran at once, with no question asked: from a script (or a paste into
    the wrong shell) it replayed everything it matched."""
    before = states(engine)
    for args in (("--dead",), ("--since", "2000-01-01"), ("--until", "2999-01-01", "--dead")):
        done = replay(worker_env, *args)
        assert done.returncode == 1 and done.stdout == ""
        assert "stdin is not a terminal" in done.stderr and "pass --yes" in done.stderr
        assert "nothing was replayed" in done.stderr
    assert "error: 3 events would be replayed" in replay(worker_env, "--dead").stderr
    assert states(engine) == before


def test_dead_with_a_tenant_and_yes_replays_that_tenants_dead_events(worker_env, engine,
                                                                      tenant, events):
    done = replay(worker_env, "--dead", "--tenant", str(tenant), "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "replayed 2\n"
    found = states(engine)
    assert found[events["acme_dead_old"]] == found[events["acme_dead_new"]] == "pending"
    assert found[events["acme_handled"]] == "handled"  # not dead: left alone
    assert found[events["globex_dead"]] == "dead"  # another tenant's
    # The record of the replay: what was asked, how many, who ran it.
    (line,) = [ln for ln in done.stderr.splitlines() if "postrelay.cli.outbox_replay" in ln]
    assert "replayed=2 actor=cli:" in line and f"tenant_id={tenant}" in line
    assert "event_id=None since=None until=None dead=True" in line


def test_dead_narrowed_by_a_range(worker_env, engine, events):
    day_ago = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S")
    done = replay(worker_env, "--dead", "--since", day_ago, "-y")
    assert done.stdout == "replayed 2\n", done.stderr  # acme's new one and globex's
    assert states(engine)[events["acme_dead_old"]] == "dead"
    assert f"since={day_ago}+00:00" in done.stderr


def test_the_terminal_question_shows_the_count_and_no_replays_nothing(worker_env, engine,
                                                                      tenant, events):
    before = states(engine)
    declined = replay_on_a_terminal(worker_env, "n\n", "--dead", "--tenant", str(tenant))
    assert declined.returncode == 1
    assert "2 events would be handed back to the relay. Replay them? [y/N]" in declined.stdout
    assert "nothing was replayed" in declined.stderr
    assert "postrelay.cli.outbox_replay" not in declined.stderr
    assert states(engine) == before

    accepted = replay_on_a_terminal(worker_env, "y\n", "--dead", "--tenant", str(tenant))
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.endswith("replayed 2\n")
    assert states(engine)[events["acme_dead_new"]] == "pending"


def test_one_event_is_replayed_without_a_question(worker_env, engine, events):
    done = replay(worker_env, "--event", str(events["globex_dead"]))
    assert done.returncode == 0 and done.stdout == "replayed 1\n", done.stderr
    assert states(engine)[events["globex_dead"]] == "pending"
    assert f"event_id={events['globex_dead']}" in done.stderr


def test_dead_with_one_event_is_refused(worker_env, engine, events):
    done = replay(worker_env, "--event", str(events["globex_dead"]), "--dead", "--yes")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("error: --dead: ")
    assert states(engine)[events["globex_dead"]] == "dead"
