"""The relay: turns outbox events into jobs, exactly once.

Each batch is one transaction: claim unhandled events (FOR UPDATE SKIP LOCKED, oldest
first), ask the routes which jobs each needs, link each (event, route) to its job, insert
the jobs whose link is new, and mark the events handled. A crash before commit leaves
everything as it was; a replay finds the links there and creates nothing (unless
retention has deleted a link's job, or it is a webhook delivery that stopped unsent: then
that job is made again).

Under a backlog, up to `concurrency` batches are in flight at once, each in its own
transaction: one batch's routing runs in Python while another's writes run in PostgreSQL.

An event whose routing fails (a route raises, asks for an invalid job, or for more jobs
than `max_jobs_per_event` or more payload than `max_bytes_per_event`) is isolated: it is
recorded with its error and retried with backoff, then parked as dead after
`max_attempts`; the events beside it are relayed in the same batch.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core import jsontext
from postrelay.core.dbcall import driver_fetch, psycopg_beneath
from postrelay.core.errors import ValidationError
from postrelay.core.ids import new_uuids
from postrelay.core.limits import (
    MAX_DEPTH,
    ROUTE_ROOM_BYTES,
    ROUTE_ROOM_DEPTH,
    max_payload_bytes,
    storable,
)
from postrelay.core.listener import Listener
from postrelay.core.service import ErrorBackoff, ServiceLoop, until_woken
from postrelay.core.settings import (
    MAX_RELAY_ATTEMPTS,
    MAX_RELAY_BATCH_SIZE,
    MAX_RELAY_BYTES_PER_EVENT,
    MAX_RELAY_CONCURRENCY,
    MAX_RELAY_JOBS_PER_EVENT,
)
from postrelay.core.telemetry import event as log_event
from postrelay.queue import (
    RELAY_KEY_PREFIX,
    Backoff,
    ExponentialBackoff,
    ValidatedJob,
    enqueue_validated_async,
    job_kinds_async,
    validated_job,
)
from postrelay.relay.ordering import defer, hold_back
from postrelay.relay.queries import OUTBOX_SQL
from postrelay.relay.routing import Event, RouteRegistry

OUTBOX_CHANNEL = "postrelay_outbox"
ERROR_CHARS = 4096  # of a failed routing's error, kept in the event's last_error


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """The relay's settings, checked as they are made with the bounds of the
    POSTRELAY_RELAY_* settings: unchecked, a batch size of 0 claimed nothing while every
    empty batch counted as full, so the relay spun against the database and relayed no
    event; a poll interval of 0 or NaN spun or broke its waits."""

    batch_size: int = 500
    max_attempts: int = 10
    poll_min_secs: float = 0.05  # adaptive polling: from this when busy...
    poll_max_secs: float = 1.0  # ...up to this when idle (LISTEN wakes it sooner)
    listen: bool = True
    # Batches in flight at once while there is a backlog (1: one after another).
    concurrency: int = 3
    # Jobs one event's routes may ask for (POSTRELAY_RELAY_MAX_JOBS_PER_EVENT): past it
    # the event fails by itself, as when a route raises.
    max_jobs_per_event: int = 10_000
    # Bytes of job payload (JSON) they may ask for (POSTRELAY_RELAY_MAX_BYTES_PER_EVENT).
    max_bytes_per_event: int = 64 << 20

    def __post_init__(self) -> None:
        _whole("batch_size", self.batch_size, MAX_RELAY_BATCH_SIZE)
        _whole("max_attempts", self.max_attempts, MAX_RELAY_ATTEMPTS)
        _whole("concurrency", self.concurrency, MAX_RELAY_CONCURRENCY)
        _whole("max_jobs_per_event", self.max_jobs_per_event, MAX_RELAY_JOBS_PER_EVENT)
        _whole("max_bytes_per_event", self.max_bytes_per_event, MAX_RELAY_BYTES_PER_EVENT)
        for name in ("poll_min_secs", "poll_max_secs"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not 0 < value <= MAX_POLL_SECS):  # NaN fails the comparison
                raise ValueError(f"{name}: must be a number of seconds, more than 0 and at "
                                 f"most {MAX_POLL_SECS:g}, got {value!r}")
        if self.poll_max_secs < self.poll_min_secs:
            raise ValueError(f"poll_max_secs: must be at least poll_min_secs "
                             f"({self.poll_min_secs:g}), got {self.poll_max_secs:g}")


MAX_POLL_SECS = 3600.0


def _whole(name: str, value: object, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise ValueError(f"{name}: must be a whole number from 1 to {maximum}, got {value!r}")


@dataclass(frozen=True, slots=True)
class BatchResult:
    handled: int
    jobs: int
    failed: int
    dead: int
    deferred: int = 0


@dataclass(slots=True)
class _Plan:
    event: Event
    jobs: list[tuple[str, ValidatedJob, bool]]  # (delivery route name, job, ordered)
    ordered: bool  # any of the jobs


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
        # The relay's own loop: woken by NOTIFY, polling adaptively as the fallback.
        self._idle = self.config.poll_min_secs  # its next wait while there is no backlog
        self._loop = ServiceLoop("relay", self._batch, self._next_wait,
                                 backoff=self._error_backoff(),
                                 failed_event="postrelay.relay.batch_failed")
        # Set while batches come back full: the extra batch loops run only then, so that
        # a quiet relay costs the database no more than one loop would.
        self._backlog = asyncio.Event()
        self._backlog_loops = [
            ServiceLoop(f"relay-{n}", self._batch, until_woken, wake=self._backlog,
                        backoff=self._error_backoff(),
                        failed_event="postrelay.relay.batch_failed")
            for n in range(1, self.config.concurrency)
        ]
        self._listener = (
            Listener(listen_url, OUTBOX_CHANNEL, self._loop.wake.set)
            if self.config.listen and listen_url else None
        )

    async def run_once(self) -> BatchResult:
        """Relay one batch in one transaction."""
        async with self.engine.begin() as transaction:
            # Every statement runs on the psycopg connection beneath the transaction:
            # SQLAlchemy's execution and result layers would cost more CPU than the
            # routing itself, on the relay's hottest path.
            conn = await psycopg_beneath(transaction)
            rows = await driver_fetch(conn, OUTBOX_SQL["outbox_claim_batch"],
                                      {"batch": self.config.batch_size})
            if not rows:
                return BatchResult(0, 0, 0, 0)
            for prepare in self.routes.preparers():
                await prepare(conn)
            events, unreadable = _events(rows)
            plans, failures = self._plan([e for e in events if e.id not in unreadable])
            failures.update(unreadable)
            if not self._kinds.issuperset(job["kind"] for p in plans for _, job, _ in p.jobs):
                # First batch, or a kind added by a migration since: look again once.
                self._kinds = frozenset(await job_kinds_async(conn))
                plans = self._drop_unknown_kinds(plans, failures)
            plans, waiting = await hold_back(conn, plans)
            await defer(conn, waiting)
            plans, jobs = await self._insert_jobs(conn, plans)
            dead = await self._record_failures(conn, events, failures)
        result = BatchResult(len(plans), jobs, len(failures), dead, len(waiting))
        log_event("postrelay.relay.batch", logging.DEBUG, handled=result.handled,
                  jobs=result.jobs, failed=result.failed)
        return result

    def _plan(self, events: list[Event]) -> tuple[list[_Plan], dict[Any, str]]:
        plans: list[_Plan] = []
        failures: dict[Any, str] = {}
        max_bytes = max_payload_bytes()  # once per batch, not per job
        for event in events:
            try:
                jobs = self._jobs_for(event, max_bytes)
            # Isolate the event; the batch goes on. BaseException too: routes are plain
            # synchronous code, so a SystemExit, KeyboardInterrupt or CancelledError here is
            # the route's own (signals reach the relay through the loop's handlers), and
            # left to rise it ended the process at this event, restart after restart.
            except BaseException as exc:
                failures[event.id] = _failure_text(exc)
                continue
            plans.append(_Plan(event, jobs, any(ordered for _, _, ordered in jobs)))
        return plans, failures

    def _jobs_for(self, event: Event, max_bytes: int) -> list[tuple[str, ValidatedJob, bool]]:
        """The jobs the routes ask for, each checked here: a job a route got wrong fails
        its own event, not the batch."""
        jobs: list[tuple[str, ValidatedJob, bool]] = []
        names: set[str] = set()  # of `jobs`: a fan-out of thousands is checked in linear time
        cap = self.config.max_jobs_per_event
        size, max_size = 0, self.config.max_bytes_per_event
        for route in self.routes.matching(event.event_type):
            # One request past what is left is enough to know: a route that yields without
            # end is read no further, and none of the event's jobs is checked or made.
            requests = route.requests(event, limit=cap - len(jobs) + 1)
            if len(jobs) + len(requests) > cap:
                raise ValidationError(
                    "jobs", f"route {route.name!r} takes the event past {cap:,} jobs, the "
                            "limit per event (POSTRELAY_RELAY_MAX_JOBS_PER_EVENT); no job of "
                            "the event was made: spread the fan-out over several events, or "
                            "raise the limit")
            for request in requests:
                name = route.name if request.key is None else f"{route.name}:{request.key}"
                # Two links of one name in a batch would fail the whole batch, again at
                # every retry, and stall every event behind this one.
                if name in names:
                    raise ValidationError(
                        "key", f"route {route.name!r} asked for two jobs named {name!r}: "
                               "each job of an event needs its own key")
                if not isinstance(request.ordered, bool):
                    # Written to a boolean column beside the batch's other links: anything
                    # else failed the whole batch, again at every retry.
                    raise ValidationError("ordered", f"must be True or False, got "
                                                     f"{request.ordered!r} (route {name!r})")
                try:
                    job = validated_job(
                        request.kind, request.payload, event.tenant_id, request.priority,
                        request.delay, None, request.max_attempts,
                        f"{RELAY_KEY_PREFIX}{event.id}:{name}",
                        # Room for the route's wrapper around a payload at the limit.
                        max_bytes=max_bytes + ROUTE_ROOM_BYTES,
                        max_depth=MAX_DEPTH + ROUTE_ROOM_DEPTH, relay_key=True)
                except ValidationError as exc:
                    raise ValidationError(
                        exc.field, f"{exc.rule} (route {name!r} asked for an invalid job)"
                    ) from None
                size += len(job["payload"])  # ASCII JSON: characters are bytes
                if size > max_size:
                    raise ValidationError(
                        "jobs", f"route {route.name!r} takes the event past {max_size:,} "
                                "bytes of job payload, the limit per event "
                                "(POSTRELAY_RELAY_MAX_BYTES_PER_EVENT); no job of the event "
                                "was made: a route that copies the event's payload into "
                                "each of its jobs multiplies it; let the jobs read the "
                                "event instead, or spread the fan-out over several events")
                names.add(name)
                jobs.append((name, job, request.ordered))
        return jobs

    def _drop_unknown_kinds(self, plans: list[_Plan], failures: dict[Any, str]) -> list[_Plan]:
        kept = []
        for plan in plans:
            unknown = [job["kind"] for _, job, _ in plan.jobs if job["kind"] not in self._kinds]
            if unknown:
                failures[plan.event.id] = f"unknown job kind {unknown[0]!r} asked for by a route"
            else:
                kept.append(plan)
        return kept

    async def _insert_jobs(
        self, conn: psycopg.AsyncConnection[Any], plans: list[_Plan]
    ) -> tuple[list[_Plan], int]:
        """Link every plan's jobs to their events, insert those whose link is new, and mark
        the events handled; returns the plans that went in and the job count."""
        rows = [(plan.event.id, name, job, ordered)
                for plan in plans for name, job, ordered in plan.jobs]
        if rows:
            ids = new_uuids(len(rows))
            ((linked,),) = await driver_fetch(conn, OUTBOX_SQL["outbox_link_many"], {
                "event_ids": [e for e, _, _, _ in rows],
                "routes": [n for _, n, _, _ in rows],
                "job_ids": ids,
                "ordered": [o for _, _, _, o in rows],
            }, binary=True)
            new = set(linked)
            made = [(job_id, row[2]) for job_id, row in zip(ids, rows, strict=True)
                    if job_id in new]
            if made:
                await driver_fetch(conn, OUTBOX_SQL["outbox_server_plans"], {})
                await enqueue_validated_async(
                    conn, [job for _, job in made], created_by="postrelay.relay",
                    ids=[job_id for job_id, _ in made])
                await driver_fetch(conn, OUTBOX_SQL["outbox_custom_plans"], {})
        if plans:
            await driver_fetch(conn, OUTBOX_SQL["outbox_mark_handled_many"], {
                "ids": [p.event.id for p in plans],
                "jobs": [len(p.jobs) for p in plans],
            }, binary=True)
        return plans, len(rows)

    async def _record_failures(
        self, conn: psycopg.AsyncConnection[Any], events: list[Event], failures: dict[Any, str]
    ) -> int:
        if not failures:
            return 0
        failed = [e for e in events if e.id in failures]
        rows = await driver_fetch(conn, OUTBOX_SQL["outbox_mark_failed_many"], {
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
        for loop in (self._loop, *self._backlog_loops):
            loop.start()

    async def stop(self) -> None:
        await asyncio.gather(*(loop.stop() for loop in (self._loop, *self._backlog_loops)))
        if self._listener is not None:
            await self._listener.stop()

    def _error_backoff(self) -> ErrorBackoff:
        return ErrorBackoff(self.config.poll_min_secs, self.config.poll_max_secs)

    async def _batch(self) -> BatchResult:
        """A round of any of the relay's loops: a batch, and whether a backlog is left."""
        try:
            result = await self.run_once()
        except Exception:  # connection lost, server restarting: the main loop backs off
            self._backlog.clear()
            raise
        if self._full(result):
            self._backlog.set()
        else:
            self._backlog.clear()
        return result

    def _full(self, result: BatchResult) -> bool:
        """Whether the batch took all it could (then there is probably more)."""
        return result.handled + result.failed + result.deferred >= self.config.batch_size

    def _next_wait(self, result: BatchResult) -> float:
        """The main loop's schedule: at once while there is a backlog; else from
        `poll_min_secs`, doubling while idle up to `poll_max_secs` (NOTIFY wakes it)."""
        if self._full(result):
            self._idle = self.config.poll_min_secs
            return 0.0
        if result.deferred:
            self._idle = self.config.poll_min_secs  # ordered events wait on their aggregate
        wait, self._idle = self._idle, min(self._idle * 2, self.config.poll_max_secs)
        return wait


def _failure_text(exc: BaseException) -> str:
    """The error an event's failed routing records: storable (a route's message may hold a
    NUL or a lone surrogate, which would fail the batch's write of every failure), and
    never raising (an exception whose str() fails), so that one event's failure cannot
    stall the events behind it."""
    try:
        message = str(exc)
    except Exception:
        message = "<exception str() failed>"
    return storable(f"{type(exc).__name__}: {message}"[:ERROR_CHARS])


def _events(rows: list[Any]) -> tuple[list[Event], dict[Any, str]]:
    """The Events of outbox_claim_batch rows, and why each whose payload or headers Python
    cannot read could not be routed. jsonb holds integers longer than Python converts, and
    nesting deeper than its decoder's recursion; SQL written by hand (another service's, in
    its own transaction) can store them. Raised here, one such event failed every batch it
    was claimed in, and the relay relayed nothing behind it."""
    events, unreadable = [], {}
    for row in rows:
        (event_id, tenant_id, aggregate_type, aggregate_id, event_type, payload, headers,
         created_at, attempts, seq) = row
        try:
            payload, headers = jsontext.decode(payload), \
                {} if headers is None else jsontext.decode(headers)
        except (ValueError, RecursionError) as exc:
            unreadable[event_id] = f"the event's payload or headers cannot be read: {exc!r}"
            payload, headers = {}, {}
        events.append(Event(
            id=event_id, tenant_id=tenant_id, aggregate_type=aggregate_type,
            aggregate_id=aggregate_id, event_type=event_type, payload=payload,
            headers=headers, created_at=created_at, attempts=attempts, seq=seq))
    return events, unreadable
