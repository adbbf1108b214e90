"""`postrelay relay` as a real process: events relayed within the LISTEN round trip, and a
relay killed with SIGKILL mid-stream loses and doubles nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import text

from postrelay.relay import emit

POSTRELAY = str(Path(sys.executable).parent / "postrelay")
ROOT = Path(__file__).resolve().parents[2]


def start_relay(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([POSTRELAY, "relay", "--app", "tests.apps.shop"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def counts(engine) -> tuple[int, int]:
    with engine.connect() as conn:
        unhandled = conn.execute(text(
            "SELECT count(*) FROM mdm.aa_outbox_event WHERE handled_at IS NULL")).scalar_one()
        jobs = conn.execute(text("SELECT count(*) FROM mdm.aa_job")).scalar_one()
    return unhandled, jobs


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def emit_orders(engine, tenant, numbers) -> None:
    with engine.begin() as conn:
        for n in numbers:
            emit(conn, "order.placed", {"n": n}, tenant_id=tenant, aggregate_type="order",
                 aggregate_id=n)


def test_relay_process_relays_and_survives_sigkill(engine, tenant, worker_env):
    env = {**worker_env, "POSTRELAY_RELAY_BATCH_SIZE": "50"}
    relay = start_relay(env)
    try:
        emit_orders(engine, tenant, range(10))
        wait_for(lambda: counts(engine) == (0, 10))
        # Kill it mid-stream: batches commit whole or not at all.
        emit_orders(engine, tenant, range(10, 3010))
        wait_for(lambda: counts(engine)[1] > 10, timeout=30)
        os.kill(relay.pid, signal.SIGKILL)
        relay.wait(10)
        relay = start_relay(env)
        wait_for(lambda: counts(engine)[0] == 0, timeout=60)
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.wait(15)
    with engine.connect() as conn:
        per_event = conn.execute(text(
            "SELECT count(*) FILTER (WHERE n <> 1) FROM (SELECT count(*) AS n FROM mdm.aa_job "
            "GROUP BY payload->>'order') c")).scalar_one()
        total = conn.execute(text("SELECT count(*) FROM mdm.aa_job")).scalar_one()
    assert total == 3010 and per_event == 0
