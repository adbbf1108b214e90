"""The relay: turns outbox events into jobs, exactly once.

Each batch is one transaction: claim unhandled events (FOR UPDATE SKIP LOCKED, oldest
first), ask the routes which jobs each needs, insert those jobs with deterministic
idempotency keys, link them to their event, and mark the events handled. A crash before
commit leaves everything as it was; a replay finds the keys taken and creates nothing.

Under a backlog, up to `concurrency` batches are in flight at once, each in its own
transaction: one batch's routing runs in Python while another's writes run in PostgreSQL.

An event whose routing fails (a route raises, or asks for an invalid job) is isolated: it
is recorded with its error and retried with backoff, then parked as dead after
`max_attempts`; the events beside it are relayed in the same batch.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core import jsontext
from postrelay.core.dbcall import driver_fetch
from postrelay.core.errors import ValidationError
from postrelay.core.listener import Listener
from postrelay.core.telemetry import event as log_event
from postrelay.queue import (
    Backoff,
    ExponentialBackoff,
    JobSpec,
    enqueue_many,
    job_kinds,
)
from postrelay.relay.emit import Q
from postrelay.relay.ordering import defer, hold_back
from postrelay.relay.routing import Event, RouteRegistry

OUTBOX_CHANNEL = "postrelay_outbox"


@dataclass(frozen=True, slots=True)
class RelayConfig:
    batch_size: int = 500
    max_attempts: int = 10
    poll_min_secs: float = 0.05  # adaptive polling: from this when busy...
    poll_max_secs: float = 1.0  # ...up to this when idle (LISTEN wakes it sooner)
    listen: bool = True
    # Batches in flight at once while there is a backlog (1: one after another).
    concurrency: int = 2


@dataclass(frozen=True, slots=True)
class BatchResult:
    handled: int
    jobs: int
    failed: int
    dead: int
    deferred: int = 0


@dataclass(frozen=True, slots=True)
class _Plan:
    event: Event
    specs: list[tuple[str, JobSpec, bool]]  # (delivery route name, job, ordered)

    @property
    def ordered(self) -> bool:
        return any(ordered for _, _, ordered in self.specs)


class Relay:
    def __init__(
        self,
        engine: AsyncEngine,
        routes: RouteRegistry,
        config: RelayConfig | None = None,
        *,
        backoff: Backoff | None = None,
        listen_url: str | None = None,
    ) -> None:
        self.engine = engine
        self.routes = routes
        self.config = config or RelayConfig()
        self.backoff = backoff or ExponentialBackoff(base_secs=1.0, cap_secs=300.0)
        self._kinds: frozenset[str] = frozenset()
        self._wake = asyncio.Event()
        # Set while batches come back full: the extra batch loops run only then.
        self._backlog = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._listener = (
            Listener(listen_url, OUTBOX_CHANNEL, self._wake.set)
            if self.config.listen and listen_url else None
        )

    async def run_once(self) -> BatchResult:
        """Relay one batch in one transaction."""
        async with self.engine.begin() as transaction:
            # Every statement runs on the psycopg connection beneath the transaction:
            # SQLAlchemy's execution and result layers would cost more CPU than the
            # routing itself, on the relay's hottest path.
            conn = (await transaction.get_raw_connection()).driver_connection
            rows = await driver_fetch(conn, Q["outbox_claim_batch"],
                                      {"batch": self.config.batch_size})
            if not rows:
                return BatchResult(0, 0, 0, 0)
            events = [_event(row) for row in rows]
            plans, failures = self._plan(events)
            if any(_unknown_kinds(p, self._kinds) for p in plans):
                # First batch, or a kind added by a migration since: look again once.
                self._kinds = frozenset(await job_kinds(conn))
                plans = self._drop_unknown_kinds(plans, failures)
            plans, waiting = await hold_back(conn, plans)
            await defer(conn, waiting)
            plans, jobs = await self._insert_jobs(conn, plans, failures)
            dead = await self._record_failures(conn, events, failures)
        result = BatchResult(len(plans), jobs, len(failures), dead, len(waiting))
        log_event("postrelay.relay.batch", logging.DEBUG, handled=result.handled,
                  jobs=result.jobs, failed=result.failed)
        return result

    def _plan(self, events: list[Event]) -> tuple[list[_Plan], dict[Any, str]]:
        plans: list[_Plan] = []
        failures: dict[Any, str] = {}
        for event in events:
            try:
                plans.append(_Plan(event, self._specs_for(event)))
            except Exception as exc:  # isolate the event; the batch goes on
                failures[event.id] = f"{type(exc).__name__}: {exc}"[:4096]
        return plans, failures

    def _specs_for(self, event: Event) -> list[tuple[str, JobSpec, bool]]:
        specs = []
        for route in self.routes.matching(event.event_type):
            for request in route.requests(event):
                name = route.name if request.key is None else f"{route.name}:{request.key}"
                spec = JobSpec(request.kind, request.payload, event.tenant_id,
                               priority=request.priority, delay=request.delay,
                               max_attempts=request.max_attempts,
                               idempotency_key=f"outbox:{event.id}:{name}")
                specs.append((name, spec, request.ordered))
        return specs

    def _drop_unknown_kinds(self, plans: list[_Plan], failures: dict[Any, str]) -> list[_Plan]:
        kept = []
        for plan in plans:
            unknown = _unknown_kinds(plan, self._kinds)
            if unknown:
                failures[plan.event.id] = f"unknown job kind {unknown[0]!r} asked for by a route"
            else:
                kept.append(plan)
        return kept

    async def _insert_jobs(
        self, conn: psycopg.AsyncConnection[Any], plans: list[_Plan], failures: dict[Any, str]
    ) -> tuple[list[_Plan], int]:
        """Insert every plan's jobs; returns the plans that went in and the job count.

        enqueue_many validates the whole batch before writing anything, so a job a route
        got wrong (say, a payload that is not an object) costs no round trip: its event is
        set aside as failed and the rest go in again.
        """
        while True:
            rows = [(plan.event.id, name, spec, ordered)
                    for plan in plans for name, spec, ordered in plan.specs]
            try:
                job_ids = await enqueue_many(conn, [spec for _, _, spec, _ in rows],
                                             created_by="postrelay.relay") if rows else []
                break
            except ValidationError as exc:
                index = _job_index(exc.field)
                if index is None:
                    raise
                event_id, route_name = rows[index][0], rows[index][1]
                failures[event_id] = f"route {route_name!r} asked for an invalid job: {exc}"
                plans = [p for p in plans if p.event.id != event_id]
        if plans:
            await driver_fetch(conn, Q["outbox_mark_handled_many"], {
                "event_ids": [e for e, _, _, _ in rows],
                "routes": [n for _, n, _, _ in rows],
                "job_ids": job_ids,
                "ordered": [o for _, _, _, o in rows],
                "ids": [p.event.id for p in plans],
                "jobs": [len(p.specs) for p in plans],
            }, binary=True)
        return plans, len(rows)

    async def _record_failures(
        self, conn: psycopg.AsyncConnection[Any], events: list[Event], failures: dict[Any, str]
    ) -> int:
        if not failures:
            return 0
        failed = [e for e in events if e.id in failures]
        rows = await driver_fetch(conn, Q["outbox_mark_failed_many"], {
            "ids": [e.id for e in failed],
            "errors": [failures[e.id] for e in failed],
            "delays": [self.backoff.delay(e.attempts + 1) for e in failed],
            "max_attempts": self.config.max_attempts,
        }, binary=True)
        for event_id, dead in rows:
            log_event("postrelay.relay.routing_failed", logging.WARNING, event_id=str(event_id),
                      dead=dead, error=failures[event_id])
        return sum(1 for _, dead in rows if dead)

    async def start(self) -> None:
        if self._listener is not None:
            self._listener.start()
        self._tasks = [asyncio.create_task(self._loop(), name="postrelay-relay")]
        self._tasks += [
            asyncio.create_task(self._backlog_loop(), name=f"postrelay-relay-{n}")
            for n in range(1, self.config.concurrency)
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._listener is not None:
            await self._listener.stop()

    def _track_backlog(self, result: BatchResult) -> bool:
        """Whether the batch took all it could (then there is probably more); the extra
        batch loops run while that holds."""
        full = result.handled + result.failed + result.deferred >= self.config.batch_size
        if full:
            self._backlog.set()
        else:
            self._backlog.clear()
        return full

    async def _loop(self) -> None:
        """The relay's own loop: woken by NOTIFY, polling adaptively as the fallback."""
        idle = self.config.poll_min_secs
        while True:
            self._wake.clear()  # before the batch: a wake-up during it is kept
            try:
                result = await self.run_once()
            except Exception as exc:  # connection lost, server restarting: back off
                log_event("postrelay.relay.batch_failed", logging.WARNING, error=repr(exc))
                self._backlog.clear()
                await self._sleep(idle)
                idle = min(idle * 2, self.config.poll_max_secs)
                continue
            if self._track_backlog(result):
                idle = self.config.poll_min_secs
                continue
            if result.deferred:
                idle = self.config.poll_min_secs  # ordered events wait on their aggregate
            await self._sleep(idle)
            idle = min(idle * 2, self.config.poll_max_secs)

    async def _backlog_loop(self) -> None:
        """One more batch in flight while the backlog lasts; idle (no queries) otherwise, so
        that a quiet relay costs the database no more than one loop would."""
        while True:
            await self._backlog.wait()
            try:
                result = await self.run_once()
            except Exception as exc:  # the main loop backs off and retries
                log_event("postrelay.relay.batch_failed", logging.WARNING, error=repr(exc))
                self._backlog.clear()
                continue
            self._track_backlog(result)

    async def _sleep(self, secs: float) -> None:
        try:
            async with asyncio.timeout(secs):
                await self._wake.wait()
        except TimeoutError:
            pass


def _event(row: tuple[Any, ...]) -> Event:
    """An Event from an outbox_claim_batch row, whose payload and headers are JSON text."""
    (event_id, tenant_id, aggregate_type, aggregate_id, event_type, payload, headers,
     created_at, attempts, seq) = row
    return Event(event_id, tenant_id, aggregate_type, aggregate_id, event_type,
                 jsontext.decode(payload), {} if headers is None else jsontext.decode(headers),
                 created_at, attempts, seq)


def _job_index(field: str) -> int | None:
    """The position in `jobs[12].payload`, as enqueue_many names a bad job's field."""
    match = re.match(r"jobs\[(\d+)\]\.", field)
    return int(match.group(1)) if match else None


def _unknown_kinds(plan: _Plan, kinds: frozenset[str]) -> list[str]:
    return [spec.kind for _, spec, _ in plan.specs if spec.kind not in kinds]
