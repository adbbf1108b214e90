"""A cron entry whose every firing fails, in a real worker: its slot stays due, so each
round (every POSTRELAY_CRON_INTERVAL_SECS) failed it again and logged a warning. Now one
line says it started failing, and `postrelay cron list` shows since when and why."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from postrelay.queue.cron import cron_create
from tests.acceptance.conftest import POSTRELAY, WorkerPool, wait_for, wait_registered

pytestmark = pytest.mark.acceptance


def _listed(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([str(POSTRELAY), "cron", "list", *args], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_entry_that_fails_every_round_is_logged_once_and_listed_as_failing(
    workers: WorkerPool, engine, tenant, worker_env: dict[str, str]
):
    with engine.begin() as conn:  # its payload was within the limit when it was created
        cron_create(conn, "too-big", "* * * * * *", "reindex", {"blob": "x" * 2000},
                    tenant_id=tenant)
    proc = workers.start(env={"POSTRELAY_MAX_PAYLOAD_BYTES": "1024",
                              "POSTRELAY_CRON_INTERVAL_SECS": "0.2"})
    wait_registered(engine, proc)

    def lines() -> list[str]:
        return [line for line in proc.log().splitlines() if "postrelay.cron.entry" in line]

    wait_for(lines, what="the entry's first failure")
    time.sleep(3.0)  # some 15 rounds more, each failing again
    assert len(lines()) == 1, "\n".join(lines())
    assert "postrelay.cron.entry_failing" in lines()[0] and "name=too-big" in lines()[0]
    assert "over the limit of 1024" in lines()[0]
    (entry,) = json.loads(_listed(worker_env, "--json", "--tenant", str(tenant)))
    assert entry["failing_since"] is not None and entry["last_run"] is None
    assert "over the limit of 1024" in entry["last_error"]
    table = _listed(worker_env, "--tenant", str(tenant))
    assert "FAILING_SINCE" in table and "over the limit of 1024" in table
