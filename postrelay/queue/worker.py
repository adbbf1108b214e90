"""The worker: claims jobs in batches and runs them concurrently on asyncio.

    worker = Worker(engine, WorkerConfig(concurrency=20), registry=registry, ...)
    await worker.start()
    ...
    await worker.stop()   # stop claiming, let runs finish within the grace period,
                          # hand the rest back uncounted

One loop claims (a single `FOR UPDATE SKIP LOCKED` statement per batch), a task per job
runs the handler, and the Completer writes outcomes in batches. A worker whose jobs are
short claims a few ahead of its free slots and holds them until a slot frees (how many and
when: queue/pace.py). A heartbeat row in mdm.aa_worker tells the rescuer that this
worker's long jobs are still alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import deque
from typing import Any
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.listener import Listener
from postrelay.core.service import ErrorBackoff, sleep_until_woken
from postrelay.core.telemetry import event
from postrelay.queue import queries
from postrelay.queue.backoff import Backoff, FixedBackoff
from postrelay.queue.cancelcheck import CancelCheck
from postrelay.queue.claimer import ClaimConnection
from postrelay.queue.completer import Completer
from postrelay.queue.enqueue import job_kinds_async
from postrelay.queue.executor import Executor
from postrelay.queue.heartbeat import Heartbeat
from postrelay.queue.metrics import WorkerMetrics
from postrelay.queue.model import Job
from postrelay.queue.outcome import Returned, decide
from postrelay.queue.pace import ClaimPace
from postrelay.queue.queries import FairShares
from postrelay.queue.registry import Registry
from postrelay.queue.served import migrated_kinds, registered_kinds
from postrelay.queue.shutdown import end_claim, end_runs
from postrelay.queue.workerconfig import WorkerConfig as WorkerConfig  # its home before

JOBS_CHANNEL = "postrelay_jobs"  # enqueue's NOTIFY (sql/job.sql)
RECONNECT_BASE_SECS = 0.1
RECONNECT_MAX_SECS = 5.0
# Limits (aa_job_limit): a worker learns which kinds have one at most this long after a
# change, and claims those kinds through job_claim_limited. While their due jobs are
# throttled it asks again this often (each ask draws what the buckets refilled).
LIMITS_REFRESH_SECS = 1.0
THROTTLED_RETRY_SECS = 0.02


def make_worker_id() -> str:
    """`<host>/<pid>/<uuid>`, as the seed's claimed_by."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4()}"


class Worker:
    def __init__(
        self,
        engine: AsyncEngine,
        config: WorkerConfig,
        *,
        registry: Registry,
        backoff: Backoff | None = None,
        listen_url: str | None = None,
        worker_id: str | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.engine = engine
        # Claims, outcome writes and heartbeats are single statements, atomic on their own:
        # autocommit spares each a BEGIN and a COMMIT round trip.
        self._auto = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._claim_conn = ClaimConnection(engine)
        self.config = config
        self.registry = registry
        self.id = worker_id or make_worker_id()
        self.executor = Executor(registry, backoff or FixedBackoff(), config.default_timeout_secs)
        self.completer = Completer(engine, self.id, on_written=self._outcomes_written)
        self.kinds = registered_kinds(self.registry.kinds(), config.kinds)
        self._fair = FairShares.of(config.tenant_weights) if config.fair else None
        self._fair_start = uuid.uuid4()  # where the next fair claim's round begins
        self._limited_start = uuid.uuid4()  # the same, for the limited claims
        self._shared_before = False  # the last claim served several tenants
        self._limited: frozenset[str] = frozenset()
        self._limits_read_at = float("-inf")
        self._listener = (
            Listener(listen_url, JOBS_CHANNEL, self.wake) if config.listen and listen_url else None
        )
        # Claimed jobs whose outcome is not yet handed to the completer.
        self._running: dict[UUID, tuple[Job, asyncio.Task[None]]] = {}
        self._cancelled: set[UUID] = set()  # runs an operator cancelled, not ended yet
        # Claimed ahead of a free slot, in claim order (priority first), with the monotonic
        # time each was claimed; started as slots free.
        self._ahead: deque[tuple[Job, float]] = deque()
        self.pace = ClaimPace(concurrency=config.concurrency,
                              claim_ahead_secs=config.claim_ahead_secs)
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._claiming: asyncio.Task[None] | None = None
        self.cancel_check = CancelCheck(self._auto, worker_id=self.id,
                                        held_ids=lambda: self.running_ids,
                                        cancel=self._cancel_held)
        self.heartbeat = Heartbeat(
            self._auto, self.id, interval_secs=config.heartbeat_secs, register=self._register,
            held_ids=lambda: self.running_ids | self.completer.pending_ids(),
            on_released=self.wake, on_returned=self.cancel_check.catch_up)
        # Whether the last claim filled every free slot: only then is there likely more
        # work, and only then does a finishing job wake the claim loop (NOTIFY does else).
        self._saturated = False
        self.claimed = 0
        self.metrics = metrics  # None: nothing recorded, one `if` per claim and per run
        if metrics is not None:
            metrics.bind(self.kinds, lambda: len(self._running), lambda: len(self._ahead))

    def wake(self) -> None:
        self._wake.set()

    def _outcomes_written(self) -> None:
        if self._saturated:  # slots may have been held back for the backlog just written
            self._wake.set()

    @property
    def running_ids(self) -> set[UUID]:
        """Jobs claimed by this worker whose outcome is not handed on: running, or held
        ahead for a slot."""
        return set(self._running) | {job.id for job, _ in self._ahead}

    async def start(self) -> None:
        await self._drop_unknown_kinds()
        await self._register()
        await self.completer.start()
        if self._listener is not None:
            self._listener.start()
        self._claiming = asyncio.create_task(self._claim_loop(), name="postrelay-claim")
        await self.heartbeat.start()
        await self.cancel_check.start()
        event("postrelay.worker.started", worker=self.id, kinds=",".join(self.kinds),
              concurrency=self.config.concurrency)

    def stop_claiming(self) -> None:
        """Claim nothing more (the first step of a graceful stop)."""
        self._stopping.set()
        self._wake.set()

    async def stop(self) -> None:
        """Stop claiming; let running jobs finish within the grace period; hand back the
        rest without counting the attempt; write every outcome; deregister."""
        self.stop_claiming()
        event("postrelay.worker.stopping", worker=self.id, running=len(self._running),
              grace_secs=self.config.grace_secs)
        self._hand_back_held()  # they never started: at once, uncounted
        # Runs that ignore the cancel stay held, so no beat hands their jobs back (shutdown.py).
        stuck = await end_runs([task for _, task in self._running.values()],
                               self.config.grace_secs)
        # A task cancelled before its first step never reached its own bookkeeping.
        for job, task in list(self._running.values()):
            if task not in stuck:
                del self._running[job.id]
                self._hand_back(job)
        await end_claim(self._claiming)
        # What a claim in flight at the stop brought in while the runs had their grace:
        # held, it would stay `running` under a gone worker until the lease ran out.
        self._hand_back_held()
        await self.heartbeat.stop()
        await self.cancel_check.stop()
        await self._claim_conn.close()
        await self.completer.stop()
        if self._listener is not None:
            await self._listener.stop()
        try:
            async with self.engine.begin() as conn:
                await queries.worker_delete(conn, id=self.id)
        except Exception as exc:  # the row expires on its own; nothing is lost
            event("postrelay.worker.deregister_failed", logging.WARNING, error=repr(exc))
        event("postrelay.worker.stopped", worker=self.id, claimed=self.claimed)

    async def _drop_unknown_kinds(self) -> None:
        async with self._auto.connect() as conn:
            known = set(await job_kinds_async(conn))
        self.kinds = migrated_kinds(self.kinds, known, asked=self.config.kinds is not None)

    async def _register(self) -> None:
        async with self.engine.begin() as conn:
            await queries.worker_register(
                conn, id=self.id, host=socket.gethostname(), pid=os.getpid(),
                tenants=self.config.tenants, kinds=self.kinds,
                concurrency=self.config.concurrency,
            )

    async def _claim_loop(self) -> None:
        """Claim for the free slots, again and again until stop_claiming(). Not a
        ServiceLoop: its wait depends on the slots, not on a round's result alone, and a
        claim in flight must finish (its rows would be lost to the rescuer) where a
        ServiceLoop is cancelled."""
        backoff = ErrorBackoff(RECONNECT_BASE_SECS, RECONNECT_MAX_SECS)
        while not self._stopping.is_set():
            self._release_long_holds()
            # Outcomes not yet written hold their slot once they pile up beyond one round
            # of jobs: backpressure, so a slow database is not handed ever more work.
            capacity = self.config.concurrency + self.pace.ahead()
            backlog = max(0, self.completer.backlog - capacity)
            free = capacity - len(self._running) - len(self._ahead) - backlog
            if free <= 0 or not self.kinds:
                self._saturated = True
                self._wake.clear()  # a finishing job sets it again
                await self._sleep(self.config.poll_interval_secs)
                continue
            if self._saturated and free < max(1, capacity // self.pace.gather_part()):
                gather = self.pace.gather_wait()
                if gather > 0:
                    self._wake.clear()
                    await self._sleep(gather)
                    continue
            self.pace.claiming()
            # Clear before claiming: a wake-up that arrives during the claim is kept.
            self._wake.clear()
            try:
                jobs, due_in = await self._claim(free)
                backoff.succeeded()
            except Exception as exc:
                delay = backoff.failed()
                event("postrelay.worker.claim_failed", logging.WARNING, error=repr(exc),
                      retry_in=delay)
                # Only a stop cuts the backoff short; finishing jobs and NOTIFYs must not
                # turn it into a retry storm against a database that is down.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), delay)
                continue
            if jobs and self.metrics is not None:
                self.metrics.claimed_batch(jobs)
            self.registry.announce(jobs)
            claimed_at = time.monotonic()
            # A claim in flight when the stop began starts nothing: stop() hands it back.
            starting = not self._stopping.is_set()
            for job in jobs:
                if starting and len(self._running) < self.config.concurrency:
                    self._spawn(job)
                else:
                    self._ahead.append((job, claimed_at))
            self._saturated = len(jobs) == free
            if len(jobs) == free:
                await asyncio.sleep(0)  # let the batch start, then claim what slots are left
                continue
            wait = self.config.poll_interval_secs
            if due_in is not None:
                wait = min(wait, max(due_in, 0.0))
            await self._sleep(wait)

    def _release_long_holds(self) -> None:
        """Hand back the held jobs once the first has waited the hold limit (queue/pace.py):
        the runs in the slots turned out long, and an idle worker could start the held jobs
        now."""
        if not self._ahead:
            return
        waited = time.monotonic() - self._ahead[0][1]
        if waited < self.pace.hold_limit_secs:
            return
        self.pace.held_too_long(waited)
        count = self._hand_back_held()
        event("postrelay.worker.held_jobs_released", worker=self.id, count=count,
              waited_secs=round(waited, 3))

    def _hand_back_held(self) -> int:
        """Every job held ahead goes back to pending; returns how many."""
        count = len(self._ahead)
        while self._ahead:
            self._hand_back(self._ahead.popleft()[0])
        return count

    def _hand_back(self, job: Job) -> None:
        """A claimed job that never ran goes back to pending, its attempt not counted."""
        self.completer.add(job, decide(job, Returned(), self.executor.backoff))
        if self.metrics is not None:
            self.metrics.returned_unrun(job.kind)

    async def _claim(self, demand: int) -> tuple[list[Job], float | None]:
        """Claim up to `demand` jobs; returns them and, when that says anything, how soon
        to claim again (None: when woken or at the poll)."""
        claimed: list[Job] = []  # what the claims that committed brought
        try:
            return await self._claim_into(claimed, demand)
        except Exception as exc:
            if not claimed:
                raise
            # The plain claim committed before the limited one failed: its jobs are this
            # worker's now, and dropped with the error they would stay `running`, unrun,
            # until a heartbeat found them. They run; the limited kinds wait a moment.
            event("postrelay.worker.claim_failed", logging.WARNING, error=repr(exc),
                  retry_in=THROTTLED_RETRY_SECS)
            self.claimed += len(claimed)
            return claimed, THROTTLED_RETRY_SECS

    async def _claim_into(self, claimed: list[Job],
                          demand: int) -> tuple[list[Job], float | None]:
        """_claim's claims, each one's jobs added to `claimed` once it has committed."""
        async with self._claim_conn.use() as conn:
            limited = await self._limited_kinds(conn)
            free = tuple(k for k in self.kinds if k not in limited)
            capped = tuple(k for k in self.kinds if k in limited)
            if free:  # never an empty tuple: to job_claim that means every kind
                claimed += await queries.job_claim(
                    conn, worker=self.id, demand=demand,
                    tenant_ids=self.config.tenants, kinds=free,
                    local_settings=self._claim_conn.local_settings, fair=self._fair,
                    fair_start=self._fair_start, shared_before=self._shared_before,
                )
                if self._fair is not None:
                    self._fair_start = queries.next_fair_start(self._fair_start, claimed)
                    self._shared_before = len({job.tenant_id for job in claimed}) > 1
            if capped and len(claimed) < demand:
                limited_jobs = await queries.job_claim_limited(
                    conn, worker=self.id, demand=demand - len(claimed),
                    tenant_ids=self.config.tenants, kinds=capped,
                    local_settings=self._claim_conn.local_settings, fair=self._fair,
                    fair_start=self._limited_start,
                )
                # Nothing taken: the tenants met first are all held back, so the next
                # claim's round starts elsewhere.
                self._limited_start = (queries.next_fair_start(self._limited_start, limited_jobs)
                                       if limited_jobs else uuid.uuid4())
                claimed += limited_jobs
            self.claimed += len(claimed)
            if claimed:
                # Limited kinds may have more as their buckets refill.
                return claimed, (THROTTLED_RETRY_SECS if capped and len(claimed) < demand
                                 else None)
            due_in = await queries.job_next_due_in(
                conn, tenant_ids=self.config.tenants, kinds=self.kinds
            )
        if capped and due_in is not None and due_in <= 0:
            due_in = THROTTLED_RETRY_SECS  # due but throttled: ask again soon, not at once
        return claimed, due_in

    async def _limited_kinds(self, conn: Any) -> frozenset[str]:
        """The served kinds that have a limit, read at most every LIMITS_REFRESH_SECS."""
        now = time.monotonic()
        if now - self._limits_read_at >= LIMITS_REFRESH_SECS:
            self._limited = frozenset(await queries.job_limit_kinds(conn))
            self._limits_read_at = now
        return self._limited

    async def _sleep(self, secs: float) -> None:
        """Sleep until woken (notify, a freed slot, stop) or `secs` pass."""
        await sleep_until_woken(self._wake, secs)

    def _spawn(self, job: Job) -> None:
        # One name for every job's task: formatting the job id into it cost 2% of the CPU
        # a worker spends on a no-op job.
        task = asyncio.create_task(self._run(job), name="postrelay-job")
        self._running[job.id] = (job, task)

    async def _run(self, job: Job) -> None:
        started = time.perf_counter()
        transition = await self.executor.execute(job)
        took = time.perf_counter() - started
        self.pace.ran(took)
        if self._running.pop(job.id, None) is not None:
            self.completer.add(job, transition)
            if self.metrics is not None:
                self.metrics.finished_run(job.kind, transition, took)
        elif job.id in self._cancelled:
            # The cancel made the job `failed` already, so its outcome changes nothing; what
            # the run recorded (an email's `unknown` attempt) is written all the same.
            self._cancelled.discard(job.id)
            self.completer.add(job, transition, superseded=True)
        # Checked here too, not only between claims: a held job must not start after the
        # limit just because a slot freed before the claim loop looked.
        self._release_long_holds()
        if self._ahead and not self._stopping.is_set():
            self._spawn(self._ahead.popleft()[0])
        if self._saturated:
            self._wake.set()

    def _cancel_held(self, job_id: UUID, actor: str) -> None:
        """Stop a job an operator cancelled: it is `failed` in the database already, so its
        run's outcome changes nothing, but what the run recorded is written (see _run).
        Asked twice for one job (its request, and the catch-up of a worker that registered
        again), it acts once."""
        entry = self._running.pop(job_id, None)
        if entry is not None:
            self._cancelled.add(job_id)
            entry[1].cancel()
        elif any(held[0].id == job_id for held in self._ahead):
            self._ahead = deque(held for held in self._ahead if held[0].id != job_id)
        else:
            return
        event("postrelay.worker.job_cancelled", job_id=str(job_id), actor=actor,
              worker=self.id)
        self._wake.set()  # its slot is free
