"""Handlers that end in odd ways, against a real worker and PostgreSQL: whatever a handler
raises or returns, its job is done, retried, dead-lettered or failed with a readable error,
and the worker goes on running other jobs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import timedelta

import pytest
from sqlalchemy import text

from postrelay.core.clock import utcnow
from postrelay.queue import PermanentError, Registry, RetryAfter, Snooze, enqueue
from postrelay.queue.maintenance import Rescuer
from postrelay.queue.model import Job
from tests.factories import job_row
from tests.integration.worker_helpers import as_awaitable, make_worker, wait_until


class OwnBaseException(BaseException):
    """A library's BaseException of its own, as some use for control flow."""


async def cancelled_elsewhere() -> None:
    """Await a future that someone else cancelled: a CancelledError no one asked of the
    handler's task."""
    future = asyncio.get_running_loop().create_future()
    future.cancel()
    await future


def state(engine, job_id) -> dict:
    with engine.connect() as conn:
        return job_row(conn, job_id)


async def run_jobs(engine, async_engine, libpq, tenant, registry, payloads, until):
    """Enqueue a `reindex` job per payload, run a worker until `until(row)` holds for each
    job's row, and return the rows."""
    with engine.begin() as conn:
        ids = [enqueue(conn, "reindex", p, tenant_id=tenant, max_attempts=3) for p in payloads]
    worker = make_worker(async_engine, libpq, registry)
    await worker.start()
    try:
        await wait_until(lambda: as_awaitable(
            all(until(state(engine, i)) for i in ids)), timeout=20)
    finally:
        await asyncio.wait_for(worker.stop(), 20)
    return [state(engine, i) for i in ids]


RAISES = {
    "SystemExit": lambda: SystemExit(3),
    "KeyboardInterrupt": KeyboardInterrupt,
    "GeneratorExit": GeneratorExit,
    "OwnBaseException": lambda: OwnBaseException("stop everything"),
}


@pytest.mark.parametrize("name", RAISES)
async def test_a_base_exception_from_a_handler_is_a_failed_attempt(
    engine, async_engine, libpq, tenant, name
):
    """Not an Exception, yet the handler's own doing: the attempt counts, the error is
    kept, the job runs again, and the worker runs the other jobs meanwhile."""
    registry = Registry()

    @registry.handler("reindex")
    async def exits(job: Job) -> None:
        if job.payload.get("exit") and job.attempts == 1:
            raise RAISES[name]()

    rows = await run_jobs(engine, async_engine, libpq, tenant, registry,
                          [{"exit": True}, {}], until=lambda r: r["state"] == "done")
    assert [(r["state"], r["attempts"]) for r in rows] == [("done", 2), ("done", 1)]
    assert name in rows[0]["last_error"] and "Traceback" in rows[0]["last_error"]


async def test_a_cancelled_error_the_worker_did_not_ask_for_counts_the_attempt(
    engine, async_engine, libpq, tenant
):
    """A CancelledError raised in the handler, not by a cancel of its task, is a failure:
    handed back uncounted, the job would run again and again without end."""
    registry = Registry()
    runs: list[int] = []

    @registry.handler("reindex")
    async def awaits_a_cancelled_future(job: Job) -> None:
        runs.append(job.attempts)
        await cancelled_elsewhere()

    [row] = await run_jobs(engine, async_engine, libpq, tenant, registry, [{}],
                           until=lambda r: r["state"] == "dlq")
    assert (row["state"], row["attempts"]) == ("dlq", 3) and runs == [1, 2, 3]
    assert "CancelledError" in row["last_error"]


async def test_a_snooze_whose_reason_quotes_a_nul_is_a_snooze(engine, async_engine, libpq,
                                                              tenant):
    """PostgreSQL refused the reason's NUL five times, and the snoozed job went to the
    DLQ instead of waiting its turn."""
    registry = Registry()

    @registry.handler("reindex")
    async def snoozes(job: Job) -> None:
        raise Snooze(3600, "421 busy \x00 try later")

    [row] = await run_jobs(engine, async_engine, libpq, tenant, registry, [{}],
                           until=lambda r: r["last_error"] is not None)
    assert (row["state"], row["attempts"]) == ("pending", 0)  # not counted, not dead
    assert row["last_error"] == "snoozed: 421 busy \ufffd try later"


class Later(RetryAfter):
    def __init__(self) -> None:  # RetryAfter's __init__ skipped: no delay_secs
        Exception.__init__(self, "later")


def retry_with_a_word_for_a_delay() -> RetryAfter:
    retry = RetryAfter(5)
    retry.delay_secs = "soon"  # type: ignore[assignment]  # set past __init__'s bound
    return retry


UNDECIDABLE = {"Later": (Later, "AttributeError"),
               "word": (retry_with_a_word_for_a_delay, "ValueError")}


@pytest.mark.parametrize("name", UNDECIDABLE)
async def test_an_outcome_that_cannot_be_decided_is_a_failed_attempt(engine, async_engine,
                                                                     libpq, tenant, name):
    """decide() raised on the handler's exception: the run's task died and its job was
    held `running` under a live heartbeat (or its outcome was refused until the DLQ)."""
    make, problem = UNDECIDABLE[name]
    registry = Registry()

    @registry.handler("reindex")
    async def odd_retry(job: Job) -> None:
        raise make()

    [row] = await run_jobs(engine, async_engine, libpq, tenant, registry, [{}],
                           until=lambda r: r["last_error"] is not None)
    assert (row["state"], row["attempts"]) == ("pending", 1)
    assert row["last_error"].startswith(f"the run's outcome could not be decided: {problem}")


async def sent(job: Job) -> None:
    """Work that runs only when awaited."""


class Unclassy:
    """A value whose __class__ raises: isinstance() on it raises too."""

    @property
    def __class__(self) -> type:
        raise RuntimeError("no class to tell")


RETURNS = {
    "coroutine": (lambda job: sent(job), "HandlerReturnError: the handler returned a "
                                         "coroutine (sent) without awaiting it"),
    "RetryAfter": (lambda job: RetryAfter(3600, "later"), "RetryAfter: later"),
    "class": (lambda job: PermanentError, "HandlerReturnError: the handler returned the "
                                          "class PermanentError, not an instance"),
    "unclassy": (lambda job: Unclassy(), "RuntimeError: no class to tell"),
}


@pytest.mark.parametrize("name", RETURNS)
async def test_a_return_that_says_the_work_was_not_done_is_not_done(engine, async_engine,
                                                                   libpq, tenant, name):
    """A coroutine returned unawaited, an outcome returned instead of raised, or its
    class: each was taken for success, and the job was `done` with its work never run."""
    make, error = RETURNS[name]
    registry = Registry()

    @registry.handler("reindex")
    async def returns(job: Job) -> object:
        return make(job)

    [row] = await run_jobs(engine, async_engine, libpq, tenant, registry, [{}],
                           until=lambda r: r["last_error"] is not None)
    assert (row["state"], row["attempts"]) == ("pending", 1) and error in row["last_error"]


async def test_a_handler_that_ignores_the_cancel_does_not_hold_up_the_stop(
    engine, async_engine, libpq, tenant
):
    """stop() waited for it without end, its heartbeat beating: the job stayed `running`
    under a live lease for as long as the process lived. Now the worker stops without it
    and leaves the job, perhaps still at work, to the rescuer after the lease."""
    registry = Registry()
    started = asyncio.Event()
    done = False  # lets the handler end once the test is over

    @registry.handler("reindex")
    async def stubborn(job: Job) -> None:
        started.set()
        give_up = time.monotonic() + 30  # so that a stop that waits for it fails, not hangs
        while not done and time.monotonic() < give_up:
            with contextlib.suppress(asyncio.CancelledError):  # not for this handler
                await asyncio.sleep(0.05)

    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {}, tenant_id=tenant)
    worker = make_worker(async_engine, libpq, registry, grace_secs=0.1)
    await worker.start()
    try:
        await asyncio.wait_for(started.wait(), 10)
        await asyncio.wait_for(worker.stop(), 15)
        row = state(engine, job_id)
        assert (row["state"], row["attempts"]) == ("running", 1)  # not handed back
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM mdm.aa_worker")).scalar_one() == 0
        later = utcnow() + timedelta(seconds=451)
        rescued = await Rescuer(async_engine, lease_secs=450, actor="test").run_once(later)
        assert rescued.pending == 1
        assert (state(engine, job_id)["state"], state(engine, job_id)["attempts"]) == (
            "pending", 1)
    finally:
        done = True


class Unsayable(Exception):
    def __repr__(self) -> str:
        raise RuntimeError("no words")


@pytest.mark.parametrize("error", [Unsayable, lambda: SystemExit(2)])
async def test_a_claim_hook_that_fails_oddly_costs_only_its_head_start(
    engine, async_engine, libpq, tenant, error
):
    """A claim hook's SystemExit, or an exception whose repr() raises, ended the claim
    loop: the claimed jobs never ran, and the worker claimed nothing more."""
    registry = Registry()

    def hook(jobs) -> None:  # noqa: ANN001
        raise error()

    async def run(job: Job) -> None:
        pass

    registry.register("reindex", run, on_claim=hook)
    rows = await run_jobs(engine, async_engine, libpq, tenant, registry, [{}, {}],
                          until=lambda r: r["state"] == "done")
    assert [(r["state"], r["attempts"]) for r in rows] == [("done", 1), ("done", 1)]


async def test_a_run_whose_cleanup_fails_on_the_stops_cancel_is_handed_back_uncounted(
    engine, async_engine, libpq, tenant
):
    """The cleanup's error was taken for the run's: a worker's restart burnt the attempt,
    and dead-lettered a job on its last."""
    registry = Registry()
    started = asyncio.Event()

    @registry.handler("reindex")
    async def cleans_up_badly(job: Job) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("rollback failed: connection closed") from None

    with engine.begin() as conn:
        job_id = enqueue(conn, "reindex", {}, tenant_id=tenant, max_attempts=1)
    worker = make_worker(async_engine, libpq, registry, grace_secs=0.1)
    await worker.start()
    await asyncio.wait_for(started.wait(), 10)
    await asyncio.wait_for(worker.stop(), 15)
    row = state(engine, job_id)
    assert (row["state"], row["attempts"], row["last_error"]) == ("pending", 0, None)
