"""The worker's Prometheus metrics, scraped over real HTTP after real runs."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from postrelay.core.settings import load_settings
from postrelay.queue import PermanentError, Registry, StopJob, enqueue
from postrelay.queue.backoff import FixedBackoff
from postrelay.queue.maintenance import RETENTION_KIND
from postrelay.queue.metrics import WorkerMetrics, serve_metrics
from postrelay.queue.model import Job
from postrelay.queue.worker import Worker, WorkerConfig
from tests.factories import job_row

# Kinds must exist in the database's enum; each plays one part here.
OK = "reindex"  # succeeds
FLAKY = "email_send"  # fails its first attempt, then succeeds
BROKEN = "virus_scan"  # PermanentError: dead-lettered at once
EXHAUSTED = "index_sync"  # always fails: retried once, then dead-lettered
STOPPED = "gin_backfill"  # StopJob: failed
IDLE = "bulk_import"  # never enqueued
SLOW = "reindex"  # outlives the grace period at shutdown

POSTRELAY = str(Path(sys.executable).parent / "postrelay")
ROOT = Path(__file__).resolve().parents[2]


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """Every sample of http://127.0.0.1:port/metrics by (name, labels)."""
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    response.raise_for_status()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def sample(samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def states(engine, ids) -> list[str]:
    with engine.connect() as conn:
        return [job_row(conn, i)["state"] for i in ids]


async def wait_until(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def make_worker(async_engine, libpq, registry, metrics, **config) -> Worker:
    config.setdefault("poll_interval_secs", 0.2)
    config.setdefault("grace_secs", 1.0)
    return Worker(async_engine, WorkerConfig(**config), registry=registry,
                  backoff=FixedBackoff(0.05), listen_url=libpq, metrics=metrics)


async def test_counts_claims_outcomes_and_durations(engine, async_engine, libpq, tenant):
    registry = Registry()

    @registry.handler(OK)
    async def ok(job: Job) -> None:
        await asyncio.sleep(0.02)

    @registry.handler(FLAKY)
    async def flaky(job: Job) -> None:
        if job.attempts == 1:
            raise ValueError("first time unlucky")

    @registry.handler(BROKEN)
    async def broken(job: Job) -> None:
        raise PermanentError("never")

    @registry.handler(EXHAUSTED)
    async def exhausted(job: Job) -> None:
        raise ValueError("always")

    @registry.handler(STOPPED)
    async def stopped(job: Job) -> None:
        raise StopJob("look at me")

    @registry.handler(IDLE)
    async def idle(job: Job) -> None:
        pass

    with engine.begin() as conn:
        ids = [enqueue(conn, OK, {"n": n}, tenant_id=tenant) for n in range(3)]
        ids.append(enqueue(conn, FLAKY, {}, tenant_id=tenant))
        ids.append(enqueue(conn, BROKEN, {}, tenant_id=tenant))
        ids.append(enqueue(conn, EXHAUSTED, {}, tenant_id=tenant, max_attempts=2))
        ids.append(enqueue(conn, STOPPED, {}, tenant_id=tenant))
    expected = ["done"] * 4 + ["dlq", "dlq", "failed"]

    metrics = WorkerMetrics()
    server = serve_metrics(metrics, 0)  # an ephemeral port on 127.0.0.1
    port = server.server_port
    worker = make_worker(async_engine, libpq, registry, metrics)
    try:
        before = scrape(port)
        await worker.start()
        try:
            await wait_until(lambda: states(engine, ids) == expected)
            scraped = await asyncio.to_thread(scrape, port)  # scraped while running
            assert sample(scraped, "postrelay_worker_running_jobs") == 0
        finally:
            await worker.stop()
        after = scrape(port)
    finally:
        server.shutdown()
        server.server_close()

    # Kinds are exported at zero before their first job.
    assert sample(before, "postrelay_jobs_claimed_total", kind=OK) == 0
    assert sample(before, "postrelay_jobs_finished_total", kind=OK, status="done") == 0

    def claimed(kind):
        return sample(after, "postrelay_jobs_claimed_total", kind=kind)

    def finished(kind, status):
        return sample(after, "postrelay_jobs_finished_total", kind=kind, status=status)

    assert {k: claimed(k) for k in (OK, FLAKY, BROKEN, EXHAUSTED, STOPPED, IDLE)} \
        == {OK: 3, FLAKY: 2, BROKEN: 1, EXHAUSTED: 2, STOPPED: 1, IDLE: 0}
    assert finished(OK, "done") == 3
    assert finished(FLAKY, "pending") == 1 and finished(FLAKY, "done") == 1
    assert finished(BROKEN, "dlq") == 1 and finished(BROKEN, "pending") == 0
    assert finished(EXHAUSTED, "pending") == 1 and finished(EXHAUSTED, "dlq") == 1
    assert finished(STOPPED, "failed") == 1
    assert finished(OK, "returned") == 0

    assert sample(after, "postrelay_job_duration_seconds_count", kind=OK) == 3
    assert 0.06 <= sample(after, "postrelay_job_duration_seconds_sum", kind=OK) < 5
    assert sample(after, "postrelay_job_duration_seconds_bucket", kind=OK, le="0.01") == 0
    assert sample(after, "postrelay_job_duration_seconds_bucket", kind=OK, le="+Inf") == 3
    assert sample(after, "postrelay_job_duration_seconds_count", kind=EXHAUSTED) == 2

    total_claimed = sum(claimed(k) for k in (OK, FLAKY, BROKEN, EXHAUSTED, STOPPED))
    assert total_claimed == 9 == worker.claimed
    assert sample(after, "postrelay_claim_batch_size_sum") == total_claimed
    assert 1 <= sample(after, "postrelay_claim_batch_size_count") <= total_claimed


async def test_runs_cut_short_at_shutdown_count_as_returned(engine, async_engine, libpq, tenant):
    registry = Registry()
    started = asyncio.Event()

    @registry.handler(SLOW)
    async def slow(job: Job) -> None:
        started.set()
        await asyncio.sleep(60)

    with engine.begin() as conn:
        job_id = enqueue(conn, SLOW, {}, tenant_id=tenant)
    metrics = WorkerMetrics()
    server = serve_metrics(metrics, 0)
    worker = make_worker(async_engine, libpq, registry, metrics, grace_secs=0.1)
    try:
        await worker.start()
        try:
            await asyncio.wait_for(started.wait(), 15)
            during = await asyncio.to_thread(scrape, server.server_port)
        finally:
            await worker.stop()
        after = scrape(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
    assert states(engine, [job_id]) == ["pending"]
    assert sample(during, "postrelay_worker_running_jobs") == 1
    assert sample(after, "postrelay_worker_running_jobs") == 0
    assert sample(after, "postrelay_jobs_claimed_total", kind=SLOW) == 1
    assert sample(after, "postrelay_jobs_finished_total", kind=SLOW, status="returned") == 1
    assert sample(after, "postrelay_jobs_finished_total", kind=SLOW, status="pending") == 0
    # A run cut short says nothing about how long the kind takes.
    assert sample(after, "postrelay_job_duration_seconds_count", kind=SLOW) == 0


def test_worker_without_metrics_records_nothing(async_engine, libpq):
    registry = Registry()
    registry.register(OK, _noop)
    worker = make_worker(async_engine, libpq, registry, None)
    assert worker.metrics is None


async def _noop(job: Job) -> None:
    return None


def test_metrics_port_setting():
    assert load_settings().worker_metrics_port is None
    settings = load_settings(worker_metrics_port=9464)
    assert (settings.worker_metrics_port, settings.worker_metrics_host) == (9464, "127.0.0.1")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def workers_registered(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM mdm.aa_worker")).scalar_one()


def test_worker_command_serves_metrics(engine, worker_env, clean_db):
    port = free_port()
    proc = subprocess.Popen(
        [POSTRELAY, "worker", "--no-maintenance", "--metrics-port", str(port)],
        env=worker_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            # Registered means started, so SIGTERM below finds the signal handlers.
            if workers_registered(engine):
                samples = scrape(port)
                break
            assert time.monotonic() < deadline, "the worker never started"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, output
    assert sample(samples, "postrelay_worker_running_jobs") == 0
    # The built-in kinds this worker serves are there from the start.
    assert sample(samples, "postrelay_jobs_claimed_total", kind=RETENTION_KIND) == 0
    assert "postrelay.worker.metrics_serving" in output


@pytest.mark.parametrize("host", ["", "no-such-host.invalid"])
def test_a_metrics_host_that_cannot_be_served_names_the_setting(worker_env, host):
    """It said "error: metrics on :9464: [Errno -2] Name or service not known"."""
    done = subprocess.run([POSTRELAY, "worker", "--metrics-port", "9464"],
                          env={**worker_env, "POSTRELAY_WORKER_METRICS_HOST": host},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "error: POSTRELAY_WORKER_METRICS_HOST and --metrics-port: cannot serve metrics on "
        f"{host!r} port 9464: Name or service not known")
