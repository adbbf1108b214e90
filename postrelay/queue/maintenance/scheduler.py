"""The cron scheduler: runs in every worker, fires each due slot exactly once.

Every tick reads the entries, finds those with a slot due since their last run, and fires
the latest such slot: claim it on the entry row (cron_claim_slot) and enqueue the job with
an idempotency key of entry + slot, in one transaction. Several schedulers may race for a
slot; the row lock and the key let exactly one job through.

An entry whose firing fails (a payload over a limit lowered since its creation, a schedule
that never comes) rolls its transaction back, so its slot is still due and it fails again
the next tick, every tick, in every worker. One broken entry must neither stop the others nor
flood the log: its failures are logged when they start, when their reason changes (at most
every REASON_GAP), once every FAILING_LOG_INTERVAL while they go on (how many since when),
and when the entry fires again; and at each of those lines the failure is recorded on the
entry (`failing_since`, `last_error`: `postrelay cron list`, the API, the dashboard), which
the next firing that succeeds clears. Those lines are the entry's, not each worker's: the
record is also the claim of the line (`cron_entry_failing` returns a row to one scheduler
only), and the recovery is said by the scheduler whose firing cleared it. Each scheduler
asks only when its own view says a line may be due, so a failing entry costs no write a
round. The times are the rounds' (the database's clock).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.errors import PostrelayError
from postrelay.core.limits import storable
from postrelay.core.service import periodic
from postrelay.core.telemetry import event
from postrelay.queue.cron import CRON_SQL, slots_between
from postrelay.queue.enqueue import enqueue_async
from postrelay.queue.outcome import ERROR_LIMIT, truncate_utf8

FAILING_LOG_INTERVAL = timedelta(minutes=1)
REASON_GAP = timedelta(seconds=10)


@dataclass(frozen=True, slots=True)
class Fired:
    name: str
    slot: datetime


@dataclass(slots=True)
class _Failing:
    """An entry whose firings fail, as this scheduler has seen them since the first."""

    failures: int  # this scheduler's failed firings
    reason: str  # the latest
    asked_reason: str | None = None  # the reason of the last ask for a line (None: never)
    asked_at: datetime | None = None

    def may_be_due(self, at: datetime) -> bool:
        """Whether a line may be due by what this scheduler saw: ask the entry then."""
        if self.asked_at is None:
            return True
        quiet = at - self.asked_at
        return quiet >= FAILING_LOG_INTERVAL or (
            self.reason != self.asked_reason and quiet >= REASON_GAP)


class CronScheduler:
    """The cron round (`run_once`: the slots it fired) every `interval_secs`."""

    def __init__(self, engine: AsyncEngine, *, interval_secs: float = 1.0) -> None:
        self.engine = engine
        self.interval_secs = interval_secs
        self._loop = periodic("cron", self.run_once, interval_secs)
        self._failing: dict[UUID, _Failing] = {}

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def run_once(self, now: datetime | None = None) -> list[Fired]:
        """Fire the due slots as of `now` (tests pass it), else the database's time."""
        async with self.engine.connect() as conn:
            entries = (await conn.execute(CRON_SQL["cron_schedule_all"])).all()
        fired = []
        for entry_id, name, tenant_id, schedule, created_at, last_run, db_now in entries:
            at = now or db_now
            try:
                due = slots_between(schedule, last_run or created_at, at)
                if due is not None and (result := await self._fire(entry_id, *due)):
                    fired.append(result)
            except Exception as exc:  # one broken entry must not stop the others
                await self._failed(entry_id, name, tenant_id, schedule, last_run, at, exc)
            else:  # fired, by this scheduler or another, or not due: failing no more
                self._failing.pop(entry_id, None)
        if self._failing:  # deleted entries: nothing more to say about them
            for gone in self._failing.keys() - {entry[0] for entry in entries}:
                del self._failing[gone]
        return fired

    async def _fire(self, entry_id: UUID, slot: datetime, next_run: datetime) -> Fired | None:
        async with self.engine.begin() as conn:
            row = (await conn.execute(
                CRON_SQL["cron_claim_slot"], {"id": entry_id, "slot": slot, "next_run": next_run}
            )).first()
            if row is None:  # another scheduler fired it, or the entry was deleted
                return None
            name, tenant_id, kind, payload, priority, max_attempts, was_failing_since = row
            await enqueue_async(
                conn, kind, payload if isinstance(payload, dict) else json.loads(payload),
                tenant_id=tenant_id, priority=priority, max_attempts=max_attempts,
                idempotency_key=f"cron:{entry_id}:{slot.isoformat()}", created_by=f"cron:{name}",
            )
        event("postrelay.cron.fired", name=name, slot=slot.isoformat())
        if was_failing_since is not None:  # this firing ended the entry's failures
            failing = self._failing.get(entry_id)
            _say("postrelay.cron.entry_recovered", logging.INFO, entry_id, name, tenant_id,
                 failures=failing.failures if failing else 0,
                 since=was_failing_since.isoformat())
        return Fired(name, slot)

    async def _failed(self, entry_id: UUID, name: str, tenant_id: UUID, schedule: str,
                      last_run: datetime | None, at: datetime, exc: Exception) -> None:
        reason = failure_reason(exc)
        failing = self._failing.get(entry_id)
        if failing is None:
            failing = self._failing[entry_id] = _Failing(1, reason)
        else:
            failing.failures += 1
            failing.reason = reason
        if not failing.may_be_due(at):
            return
        failing.asked_reason, failing.asked_at = reason, at
        try:
            async with self.engine.begin() as conn:
                claimed = (await conn.execute(CRON_SQL["cron_entry_failing"], {
                    "id": entry_id, "last_run": last_run, "at": at, "error": reason,
                    "reason_before": at - REASON_GAP,
                    "still_before": at - FAILING_LOG_INTERVAL})).first()
        except Exception as record_exc:  # not recorded, and unknown whether said elsewhere
            _say("postrelay.cron.entry_failing_unrecorded", logging.WARNING, entry_id, name,
                 tenant_id, schedule=schedule, error=reason,
                 record_error=failure_reason(record_exc))
            return
        if claimed is None:  # another scheduler said it, or the entry fired meanwhile
            return
        since, was_failing_since, previous_error = claimed
        if was_failing_since is None:
            _say("postrelay.cron.entry_failing", logging.WARNING, entry_id, name, tenant_id,
                 schedule=schedule, error=reason)
        elif reason != previous_error:
            _say("postrelay.cron.entry_failing", logging.WARNING, entry_id, name, tenant_id,
                 schedule=schedule, error=reason, failures=failing.failures,
                 since=since.isoformat(), previous_error=previous_error)
        else:
            _say("postrelay.cron.entry_still_failing", logging.WARNING, entry_id, name,
                 tenant_id, error=reason, failures=failing.failures, since=since.isoformat())


def _say(what: str, level: int, entry_id: UUID, name: str, tenant_id: UUID,
         **fields: Any) -> None:
    event(what, level, name=name, tenant=str(tenant_id), entry=str(entry_id), **fields)


def failure_reason(exc: BaseException) -> str:
    """Why a firing failed, the same words each time it fails the same way: postrelay's
    own errors by their message, written to be read (`payload: is 2011 bytes as JSON, over
    the limit of 1024 ...`); a database error by the driver's first line (SQLAlchemy's text
    adds the statement and its parameters, the slot's key among them); anything else by
    its class and message."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig
    try:
        lines = str(exc).strip().splitlines()
    except Exception:
        lines = ["<str() failed>"]
    if not lines:
        text = type(exc).__name__
    elif isinstance(exc, PostrelayError):
        text = lines[0]
    else:
        text = f"{type(exc).__name__}: {lines[0]}"
    return truncate_utf8(storable(text), ERROR_LIMIT)
