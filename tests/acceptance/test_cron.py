"""A cron entry whose every firing fails, in real workers: its slot stays due, so each
round (every POSTRELAY_CRON_INTERVAL_SECS) failed it again and logged a warning, in every
worker. Now one line says it started failing, whatever the number of workers, and
`postrelay cron list` shows since when and why."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from sqlalchemy import text

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


def test_two_workers_say_a_failing_entry_once_and_its_recovery_once(
    workers: WorkerPool, engine, tenant
):
    """Each worker fails the same slot every round. Each logged the failure it saw itself,
    so two workers wrote every line twice; the entry's lines are said by one of them."""
    with engine.begin() as conn:
        cron_create(conn, "too-big", "* * * * * *", "reindex", {"blob": "x" * 2000},
                    tenant_id=tenant)
    env = {"POSTRELAY_MAX_PAYLOAD_BYTES": "1024", "POSTRELAY_CRON_INTERVAL_SECS": "0.2"}
    procs = [workers.start(env=env), workers.start(env=env)]
    wait_registered(engine, *procs)

    def lines(event: str) -> list[str]:
        return [line for proc in procs for line in proc.log().splitlines()
                if event in line and "name=too-big" in line]

    wait_for(lambda: lines("postrelay.cron.entry_failing"), what="the entry's first failure")
    time.sleep(3.0)  # some 15 rounds more in each worker, each failing again
    assert len(lines("postrelay.cron.entry")) == 1, "\n".join(lines("postrelay.cron.entry"))

    with engine.begin() as conn:  # a payload within the limit: the next firing succeeds
        conn.execute(text("UPDATE mdm.aa_cron_entry SET payload = '{}' WHERE name = 'too-big'"))
    wait_for(lambda: lines("postrelay.cron.entry_recovered"), what="the entry's recovery")
    time.sleep(1.0)  # both workers' next rounds, firing now
    said = lines("postrelay.cron.entry")
    assert len(said) == 2 and "postrelay.cron.entry_recovered" in said[-1], "\n".join(said)
