"""Helpers for the worker's integration tests: a worker with test settings, and waits."""

from __future__ import annotations

import asyncio
import time

from sqlalchemy import text

from postrelay.queue.backoff import FixedBackoff
from postrelay.queue.worker import Worker, WorkerConfig
from tests.factories import job_row


def make_worker(async_engine, libpq, registry, **config) -> Worker:
    config.setdefault("poll_interval_secs", 0.2)
    config.setdefault("grace_secs", 1.0)
    backoff = config.pop("backoff", FixedBackoff(0.05))
    metrics = config.pop("metrics", None)
    return Worker(async_engine, WorkerConfig(**config), registry=registry, backoff=backoff,
                  listen_url=libpq, metrics=metrics)


async def wait_until(predicate, timeout: float = 15.0, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval)


async def run_until(async_engine, libpq, registry, predicate, **config) -> Worker:
    """Start a worker, wait until `predicate()` (a plain function) holds, stop it."""
    worker = make_worker(async_engine, libpq, registry, **config)
    await worker.start()
    try:
        await wait_until(lambda: as_awaitable(predicate()))
    finally:
        await worker.stop()
    return worker


async def as_awaitable(value):
    """A plain value as the awaitable `wait_until` polls."""
    return value


def job_row_attempts(engine, job_id):
    with engine.connect() as conn:
        row = job_row(conn, job_id)
    return row["attempts"], row["state"]


def count_status(engine, status: str) -> int:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM mdm.aa_job WHERE status = CAST(:s AS mdm.job_status)"),
            {"s": status},
        ).scalar_one()


def waiting_on_a_lock(engine, n: int, table: str) -> bool:
    """Whether `n` sessions of this database wait on a lock in a statement naming `table`."""
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE :like"),
            {"like": f"%{table}%"}).scalar_one() >= n
