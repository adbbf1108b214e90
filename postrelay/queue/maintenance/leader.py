"""The maintenance loop: one worker at a time leads and runs the rescuer, the flow keeper
(ended throttles, idle limit buckets) and the tallies (the done rollup, maintenance/rollup.py,
and those the layers above give it, such as the email hour tally); the others only try to
take the lead, every round.

On a direct connection leadership is a session-level advisory lock, held on a connection of
the leader's own: PostgreSQL frees it the moment that connection drops, so when the leader
dies, even by SIGKILL, the next follower's round takes over. A leader that stops without
dying (SIGSTOP, a frozen VM) keeps its connection open; the server closes it, and frees
the lock, once it has sat idle for LEASE_ROUNDS rounds, as the row lease below would run
out. A leader that comes back finds its connection gone and leads no more.

Behind a transaction pooler there is no session to hold a lock in; there leadership is
the `maintenance` row lease, renewed every round and good for LEASE_ROUNDS rounds: a dead
leader's lease runs out within three rounds and a follower takes over in the fourth.
Either way the leader is named in mdm.aa_lease (the lock holder overwrites the row), for
operators to see.

How soon a dead worker's jobs are rescued: a job becomes stale one job lease after its
claim and its worker's last heartbeat, so within a job lease of the death, and the leader
finds it within one round: within lease + interval. The interval is at most a quarter of
the job lease (`maintenance_interval`), so behind a pooler a dead leader's successor (four
rounds) is in place before the job becomes stale, and the bound is the same, given rounds
that take no longer than the interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.db import behind_pooler
from postrelay.core.heldconn import HeldConnection
from postrelay.core.service import periodic
from postrelay.queue import queries
from postrelay.queue.maintenance.flowkeeper import FlowKeeper
from postrelay.queue.maintenance.rescuer import Rescuer

LEASE_NAME = "maintenance"
# The advisory lock of the maintenance leader, in the database's own lock space: any
# constant works, the same in every worker.
LEADER_LOCK_KEY = 0x706F_7374_6D61  # "postma"
LEASE_ROUNDS = 3  # a row lease outlives this many missed rounds, so leadership does not flap
ROUNDS_PER_JOB_LEASE = 4
# The lock's connection outlives a stall of LEASE_ROUNDS rounds, but never less than this:
# a round itself takes some milliseconds, and a lease of a fraction of a second would make
# the lock go between every two rounds.
MIN_LOCK_IDLE_SECS = 1.0


class Rollup(Protocol):
    """A round of counting what has closed, into a table that pages read instead."""

    async def run_once(self) -> object: ...


def maintenance_interval(configured_secs: float, job_lease_secs: float) -> float:
    """The configured interval, but at least ROUNDS_PER_JOB_LEASE rounds per job lease: a
    4 s lease checked every 30 s would be rescued 30 s late."""
    return min(configured_secs, job_lease_secs / ROUNDS_PER_JOB_LEASE)


class Maintenance:
    """The maintenance round (`run_once`) every `interval_secs`."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        holder: str,
        interval_secs: float,
        rescuer: Rescuer,
        flow: FlowKeeper | None = None,
        rollups: Sequence[Rollup] = (),
    ) -> None:
        self.engine = engine
        self.interval_secs = interval_secs
        self.holder = holder
        self.rescuer = rescuer
        self.flow = flow or FlowKeeper(engine)
        self.rollups = tuple(rollups)
        # The connection that holds the leader's lock; None behind a pooler (row lease).
        idle = queries.leader_idle_timeout(
            secs=max(interval_secs * LEASE_ROUNDS, MIN_LOCK_IDLE_SECS))
        self._lock = None if behind_pooler(engine) else HeldConnection(engine, (idle,))
        self._locked = False
        self._loop = periodic("maintenance", self.run_once, interval_secs)

    async def run_once(self) -> bool:
        """One round; returns whether this process was the leader."""
        if not await self._lead():
            return False
        await self.rescuer.run_once()  # first: a failing tally must not delay a rescue
        await self.flow.run_once()
        for rollup in self.rollups:
            await rollup.run_once()
        return True

    async def _lead(self) -> bool:
        ttl = self.interval_secs * LEASE_ROUNDS
        if self._lock is None:
            async with self.engine.begin() as conn:
                return await queries.lease_acquire(
                    conn, name=LEASE_NAME, holder=self.holder, ttl_secs=ttl)
        was_locked = self._locked
        try:
            return await self._take_lock(self._lock, ttl)
        except Exception:
            if not was_locked:
                raise
            # The server closed the lock's connection after a round (or a stop) longer
            # than the idle timeout, and freed the lock: try for it again, on a new one.
            return await self._take_lock(self._lock, ttl)

    async def _take_lock(self, lock: HeldConnection, ttl: float) -> bool:
        try:
            async with lock.use() as conn:
                if not self._locked:
                    self._locked = await queries.leader_try_lock(conn, key=LEADER_LOCK_KEY)
                if self._locked:
                    # Also proof that the lock's connection, hence the lock, is still there.
                    await queries.lease_take(conn, name=LEASE_NAME, holder=self.holder,
                                             ttl_secs=ttl)
        except BaseException:
            self._locked = False  # the failed block dropped the connection, and the lock
            raise
        return self._locked

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        try:
            async with self.engine.begin() as conn:
                await queries.lease_release(conn, name=LEASE_NAME, holder=self.holder)
        except Exception:  # the lease expires by itself
            pass
        if self._lock is not None:
            if self._locked:
                try:  # free the lock now, for the next leader's next round
                    async with self._lock.use() as conn:
                        await queries.leader_unlock(conn, key=LEADER_LOCK_KEY)
                except Exception:  # the connection is gone, and the lock with it
                    pass
            await self._lock.close()
            self._locked = False
