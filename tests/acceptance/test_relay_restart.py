"""A relay process rides out a database server restart: every event committed before, during
(once the server is back) and after the restart is relayed, each into exactly one job.

The test emits from a thread all along. While the server is down its emits fail; it keeps
trying, and every attempt emits a new order number, so an attempt whose commit was lost in
the shutdown (or went through unnoticed) can never pass for a doubled job. The check is on
what the database holds: each committed event handled, one job per order."""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from uuid import UUID

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from postrelay.relay import emit
from tests.acceptance.conftest import (
    POSTRELAY,
    REPO_ROOT,
    WorkerPool,
    WorkerProcess,
    stop_server,
    wait_for,
)

pytestmark = pytest.mark.acceptance

SHOP_APP = "tests.apps.shop"  # order.placed → one `reindex` job with {"order": aggregate_id}


class RelayPool(WorkerPool):
    """`postrelay relay` subprocesses, killed at teardown like the pool's workers."""

    def start_relay(self, *, env: Mapping[str, str] | None = None) -> WorkerProcess:
        log_path = self.folder / f"relay-{len(self.procs)}.log"
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(
                [str(POSTRELAY), "relay", "--app", SHOP_APP], cwd=REPO_ROOT,
                env={**self.env, **(env or {})}, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        proc = WorkerProcess(popen, log_path)
        self.procs.append(proc)
        return proc


class Emitter(threading.Thread):
    """Emits an `order.placed` every `every` seconds, retrying while the server is down."""

    def __init__(self, engine: Engine, tenant: UUID, every: float = 0.05) -> None:
        super().__init__(name="emitter", daemon=True)
        self.engine, self.tenant, self.every = engine, tenant, every
        self.committed: list[int] = []  # the orders whose commit succeeded
        self.failures = 0
        self._next = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.every):
            order, self._next = self._next, self._next + 1  # a new order for every attempt
            try:
                with self.engine.begin() as conn:
                    emit(conn, "order.placed", {"n": order}, tenant_id=self.tenant,
                         aggregate_type="order", aggregate_id=order)
            except DBAPIError:
                self.failures += 1
                continue
            self.committed.append(order)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=30)


@pytest.fixture
def relays(worker_env: dict[str, str], tmp_path: Path) -> Iterator[RelayPool]:
    pool = RelayPool(worker_env, tmp_path)
    try:
        yield pool
    finally:
        pool.close()


def handled_orders(engine: Engine) -> set[int]:
    with engine.connect() as conn:
        return {int(n) for n in conn.execute(text(
            "SELECT aggregate_id FROM mdm.aa_outbox_event WHERE handled_at IS NOT NULL"
        )).scalars()}


def unhandled(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text(  # type: ignore[no-any-return]
            "SELECT count(*) FROM mdm.aa_outbox_event WHERE handled_at IS NULL")).scalar_one()


def test_relay_survives_database_server_restart(own_db, relays: RelayPool):
    uri, server, engine, tenant = own_db
    proc = relays.start_relay(env={"POSTRELAY_DATABASE_URL": uri})
    emitter = Emitter(engine, tenant)
    emitter.start()
    try:
        wait_for(lambda: len(handled_orders(engine)) >= 20, timeout=20,
                 what="the relay to relay the first events")
        stop_server(server)
        wait_for(lambda: emitter.failures >= 10
                 and "postrelay.relay.batch_failed" in proc.log(), timeout=20,
                 what="the emitter and the relay to notice the server is gone")
        server.ensure_postgres_running()
        back_at = len(emitter.committed)
        wait_for(lambda: len(emitter.committed) >= back_at + 20, timeout=20,
                 what="events emitted after the restart")
    finally:
        emitter.stop()

    wait_for(lambda: unhandled(engine) == 0, timeout=20, what="every event to be relayed")
    with engine.connect() as conn:
        events = dict(conn.execute(text(
            "SELECT aggregate_id::int, jobs_created FROM mdm.aa_outbox_event")).all())
        jobs_per_order = dict(conn.execute(text(
            "SELECT (payload->>'order')::int, count(*) FROM mdm.aa_job "
            "WHERE job_kind::text = 'reindex' GROUP BY 1")).all())
        other_jobs = conn.execute(text(
            "SELECT count(*) FROM mdm.aa_job WHERE job_kind::text <> 'reindex'")).scalar_one()
    assert emitter.failures > 0  # the emitter did see the server go away
    assert set(emitter.committed) <= set(events)  # nothing committed was lost
    assert set(events.values()) == {1}  # every event handled with its one job...
    assert jobs_per_order == dict.fromkeys(events, 1)  # ...and no job doubled or stray
    assert other_jobs == 0
    assert proc.alive
    proc.send(signal.SIGTERM)
    assert proc.wait() == 0
