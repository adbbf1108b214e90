"""The queue's SQL, by name, and one thin typed function per hot-path statement.

The statements themselves live in `sql/job.sql` and `sql/claim.sql`; nothing here builds
SQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, cast
from uuid import UUID, uuid4

import psycopg
from sqlalchemy import TextClause
from sqlalchemy.ext.asyncio import AsyncConnection

from postrelay.core import jsontext
from postrelay.core.dbcall import driver_fetch, driver_fetch_after, psycopg_sql
from postrelay.core.sqlfiles import load_queries
from postrelay.queue.model import Job

JOB_SQL = load_queries(
    "postrelay.queue", "sql/job.sql", "sql/claim.sql", "sql/limited.sql")


@dataclass(frozen=True, slots=True)
class FairShares:
    """Fair claiming's tenant weights (POSTRELAY_TENANT_WEIGHTS): a tenant not named
    weighs 1. Kept as the two arrays job_claim_fair takes."""

    tenants: list[UUID]
    weights: list[int]

    @classmethod
    def of(cls, weights: dict[UUID, int] | None = None) -> FairShares:
        pairs = sorted((weights or {}).items())
        return cls([t for t, _ in pairs], [w for _, w in pairs])


async def job_claim(
    conn: AsyncConnection | psycopg.AsyncConnection[Any],
    *,
    worker: str,
    demand: int,
    tenant_ids: Sequence[UUID] | None,
    kinds: Sequence[str] | None,
    local_settings: bool = False,
    fair: FairShares | None = None,
    fair_start: UUID | None = None,
    shared_before: bool = False,
) -> list[Job]:
    """Claim up to `demand` jobs; with `fair`, shared out across the tenants waiting at the
    most urgent priority level. A fair claim first tries job_claim, which claims only when
    no other tenant waits there, and shares the claim out with job_claim_fair when it
    claimed nothing; `shared_before` (the worker's last claim served several tenants) goes
    to job_claim_fair at once. With `local_settings` (behind a transaction pooler, where
    the claim connection cannot keep session settings), the claim's planner and commit
    settings are set for its own transaction, in the same round trip."""
    params: dict[str, Any] = {
        "worker": worker,
        "demand": demand,
        "tenant_ids": list(tenant_ids) if tenant_ids else None,
        "kinds": list(kinds) if kinds else None,
    }
    rows: list[Any] = []
    if fair is None or not shared_before:
        rows = await _fetch_claim(conn, "job_claim", {**params, "fair": fair is not None},
                                  local_settings)
    if fair is not None and not rows:
        # Where the round of tenants begins (see next_fair_start); random when not given.
        rows = await _fetch_claim(conn, "job_claim_fair", {
            **params, "start": fair_start or uuid4(), "weight_tenants": fair.tenants,
            "weights": fair.weights}, local_settings)
    jobs = [_claimed_job(*row) for row in rows]
    # In the order they were chosen, so that jobs held ahead of a slot start by priority.
    jobs.sort(key=_claim_order)
    return jobs


async def _fetch_claim(conn: AsyncConnection | psycopg.AsyncConnection[Any], name: str,
                       params: dict[str, Any], local_settings: bool) -> list[Any]:
    if local_settings:
        return await driver_fetch_after(conn, JOB_SQL["job_claim_local_settings"],
                                        JOB_SQL[name], params)
    return await driver_fetch(conn, JOB_SQL[name], params)


# The most urgent due jobs a limited claim considers, and the (priority level, tenant) pairs
# its walk may visit beyond them for their oldest jobs (sql/limited.sql, job_claim_limited):
# past both, a job waits behind the held-back ones ahead of it.
LIMITED_CLAIM_SCAN = 1000
LIMITED_CLAIM_PAIRS = 32


async def job_claim_limited(
    conn: AsyncConnection | psycopg.AsyncConnection[Any],
    *,
    worker: str,
    demand: int,
    tenant_ids: Sequence[UUID] | None,
    kinds: Sequence[str],
    local_settings: bool = False,
    fair: FairShares | None = None,
    fair_start: UUID | None = None,
) -> list[Job]:
    """Claim up to `demand` jobs of limited `kinds`, as many as their limits allow: one
    transaction, in which job_limit_lock makes limited claims of these kinds take turns
    across every worker, and job_claim_limited claims in a statement of its own (so it
    sees what the claim before it committed). With `fair`, the claim looks past a tenant's
    held-back backlog for the others' jobs and shares the allowances out across tenants
    within a priority level, its round of tenants starting at `fair_start` (random when
    not given; see next_fair_start)."""
    driver = await _driver(conn)
    shares = fair or FairShares.of()
    params = {
        "worker": worker,
        "demand": demand,
        "tenant_ids": list(tenant_ids) if tenant_ids else None,
        "kinds": list(kinds),
        "scan": max(LIMITED_CLAIM_SCAN, demand),
        "fair": fair is not None,
        "start": fair_start or uuid4(),
        "pairs": LIMITED_CLAIM_PAIRS,
        "weight_tenants": shares.tenants,
        "weights": shares.weights,
    }
    async with driver.transaction():
        if local_settings:
            await driver.execute(psycopg_sql(JOB_SQL["job_claim_local_settings"]))
        await driver.execute(psycopg_sql(JOB_SQL["job_limit_lock"]), {"kinds": params["kinds"]})
        cursor = await driver.execute(psycopg_sql(JOB_SQL["job_claim_limited"]), params)
        rows = await cursor.fetchall()
    jobs = [_claimed_job(*row) for row in rows]
    jobs.sort(key=_claim_order)
    return jobs


async def job_limit_kinds(conn: AsyncConnection | psycopg.AsyncConnection[Any]) -> set[str]:
    """The kinds that have a limit of any scope."""
    return {row[0] for row in await driver_fetch(conn, JOB_SQL["job_limit_kinds"], {})}


def next_fair_start(start: UUID, jobs: Sequence[Job]) -> UUID:
    """Where the next fair claim's round of tenants begins: at the last tenant this one
    reached. job_claim_fair walks tenant ids downwards from `start` and then round from the
    highest, so that is the lowest claimed tenant id at or above `start` when the round went
    round, else the lowest below it. A worker that claims few jobs at a time thus serves its
    tenants in turn instead of by chance."""
    tenants = {job.tenant_id for job in jobs}
    if not tenants:
        return start
    wrapped = [t for t in tenants if t >= start]
    return min(wrapped) if wrapped else min(tenants)


def _claim_order(job: Job) -> tuple[int, datetime]:
    return job.priority, job.available_at


def _claimed_job(job_id: UUID, tenant_id: UUID, kind: str, payload: str, *rest: Any) -> Job:
    """A Job from a job_claim row, whose payload is JSON text. A payload jsonb holds and
    Python cannot read (an integer past Python's 4,300 digits, nesting past its recursion
    limit: SQL written by hand can store one) makes a job that says why, which the executor
    dead-letters: raised here, it failed the whole claim after the claim had committed, so
    that row and every job claimed with it stayed `running`, and were claimed again and
    failed again each time the rescuer handed them back."""
    try:
        return Job(job_id, tenant_id, kind, jsontext.decode(payload), *rest)
    except (ValueError, RecursionError) as exc:
        return replace(Job(job_id, tenant_id, kind, {}, *rest),
                       unreadable_payload=f"{type(exc).__name__}: {exc}")


async def job_next_due_in(
    conn: AsyncConnection | psycopg.AsyncConnection[Any],
    *,
    tenant_ids: Sequence[UUID] | None,
    kinds: Sequence[str] | None,
) -> float | None:
    [(due_in,)] = await driver_fetch(conn, JOB_SQL["job_next_due_in"], {
        "tenant_ids": list(tenant_ids) if tenant_ids else None,
        "kinds": list(kinds) if kinds else None,
    })
    return None if due_in is None else float(due_in)


async def job_finalize_many(
    conn: AsyncConnection | psycopg.AsyncConnection[Any],
    *,
    worker: str,
    ids: list[UUID],
    attempts: list[int],
    statuses: list[str],
    delays: list[float | None],
    errors: list[str | None],
    refunds: list[bool],
    flush: bool = True,
    effects: Sequence[tuple[TextClause, Any]] = (),
) -> set[UUID]:
    """Write a batch of outcomes; returns the ids whose guard held (the rest were rescued).
    Without `flush`, the transaction's commit does not wait for the WAL flush. The `effects`
    statements run first, in the same transaction and round trip (driver_fetch_after).

    On the psycopg connection beneath `conn`, with binary parameters: dumping its six
    arrays in text cost more than the rest of a no-op job's run."""
    first = None if flush else JOB_SQL["job_outcome_no_flush"]
    rows = await driver_fetch_after(
        conn,
        first,
        JOB_SQL["job_finalize_many"],
        {
            "worker": worker,
            "ids": ids,
            "attempts": attempts,
            "statuses": statuses,
            "delays": delays,
            "errors": errors,
            "refunds": refunds,
        },
        binary=True,
        between=effects,
    )
    return {row[0] for row in rows}


async def job_complete_many(
    conn: AsyncConnection | psycopg.AsyncConnection[Any],
    *,
    worker: str,
    ids: list[UUID],
    attempts: list[int],
    flush: bool = True,
    effects: Sequence[tuple[TextClause, Any]] = (),
) -> set[UUID]:
    """`job_finalize_many` for a batch of successes only, on one plan per connection (the
    `effects` statements too)."""
    plan = "job_complete_plan" if flush else "job_complete_plan_no_flush"
    rows = await driver_fetch_after(
        conn, JOB_SQL[plan], JOB_SQL["job_complete_many"],
        {"worker": worker, "ids": ids, "attempts": attempts}, binary=True, between=effects,
    )
    return {row[0] for row in rows}


async def job_rescue_stale(
    conn: AsyncConnection, *, now: datetime | None, lease_secs: float, limit: int,
    actor: str
) -> list[tuple[UUID, str]]:
    result = await conn.execute(
        JOB_SQL["job_rescue_stale"],
        {"now": now, "lease_secs": lease_secs, "limit": limit, "actor": actor},
    )
    return [(row[0], row[1]) for row in result.fetchall()]


async def database_now(conn: AsyncConnection) -> datetime:
    """The database's clock, in UTC. It comes back in the session's zone (the server's
    `timezone`, or PGTZ), where subtracting days counts wall-clock days: a window across
    a change to daylight time ended an hour early."""
    result = await conn.execute(JOB_SQL["database_now"])
    return cast(datetime, result.scalar_one()).astimezone(UTC)


async def job_delete_done_before(conn: AsyncConnection, *, before: datetime, batch: int) -> int:
    result = await conn.execute(JOB_SQL["job_delete_done_before"],
                                {"before": before, "batch": batch})
    return result.rowcount


async def job_audit_delete_before(conn: AsyncConnection, *, before: datetime, batch: int) -> int:
    result = await conn.execute(JOB_SQL["job_audit_delete_before"],
                                {"before": before, "batch": batch})
    return result.rowcount


async def cron_audit_delete_before(conn: AsyncConnection, *, before: datetime,
                                   batch: int) -> int:
    result = await conn.execute(JOB_SQL["cron_audit_delete_before"],
                                {"before": before, "batch": batch})
    return result.rowcount


async def flow_audit_delete_before(conn: AsyncConnection, *, before: datetime,
                                   batch: int) -> int:
    result = await conn.execute(JOB_SQL["flow_audit_delete_before"],
                                {"before": before, "batch": batch})
    return result.rowcount


async def worker_register(
    conn: AsyncConnection,
    *,
    id: str,
    host: str,
    pid: int,
    tenants: Sequence[UUID] | None,
    kinds: Sequence[str] | None,
    concurrency: int,
) -> None:
    await conn.execute(
        JOB_SQL["worker_register"],
        {
            "id": id,
            "host": host,
            "pid": pid,
            "tenants": list(tenants) if tenants else None,
            "kinds": list(kinds) if kinds else None,
            "concurrency": concurrency,
        },
    )


async def worker_heartbeat(conn: AsyncConnection, *, id: str) -> bool:
    result = await conn.execute(JOB_SQL["worker_heartbeat"], {"id": id})
    return result.rowcount == 1


async def job_cancel_take(conn: AsyncConnection, *, ids: list[UUID]) -> list[tuple[UUID, str]]:
    result = await conn.execute(JOB_SQL["job_cancel_take"], {"ids": ids})
    return [(row.job_id, row.actor) for row in result]


async def job_cancel_missed(conn: AsyncConnection, *, worker: str,
                            ids: list[UUID]) -> list[tuple[UUID, str]]:
    result = await conn.execute(JOB_SQL["job_cancel_missed"], {"worker": worker, "ids": ids})
    return [(row.job_id, row.actor) for row in result]


async def job_cancel_prune(conn: AsyncConnection) -> int:
    result = await conn.execute(JOB_SQL["job_cancel_prune"])
    return result.rowcount


async def worker_delete(conn: AsyncConnection, *, id: str) -> None:
    await conn.execute(JOB_SQL["worker_delete"], {"id": id})


async def worker_delete_dead(conn: AsyncConnection, *, now: datetime | None,
                             lease_secs: float) -> int:
    result = await conn.execute(JOB_SQL["worker_delete_dead"],
                                {"now": now, "lease_secs": lease_secs})
    return result.rowcount


async def lease_acquire(conn: AsyncConnection, *, name: str, holder: str, ttl_secs: float) -> bool:
    result = await conn.execute(
        JOB_SQL["lease_acquire"], {"name": name, "holder": holder, "ttl_secs": ttl_secs}
    )
    return result.first() is not None


async def lease_take(
    conn: psycopg.AsyncConnection[Any], *, name: str, holder: str, ttl_secs: float
) -> None:
    await driver_fetch(conn, JOB_SQL["lease_take"],
                       {"name": name, "holder": holder, "ttl_secs": ttl_secs})


async def leader_try_lock(conn: psycopg.AsyncConnection[Any], *, key: int) -> bool:
    [(locked,)] = await driver_fetch(conn, JOB_SQL["leader_try_lock"], {"key": key})
    return bool(locked)


def leader_idle_timeout(*, secs: float) -> TextClause:
    """The session setting of the leader's lock connection (HeldConnection runs it once)."""
    return JOB_SQL["leader_idle_timeout"].bindparams(timeout_ms=max(1, round(secs * 1000)))


async def leader_unlock(conn: psycopg.AsyncConnection[Any], *, key: int) -> None:
    await driver_fetch(conn, JOB_SQL["leader_unlock"], {"key": key})


async def lease_release(conn: AsyncConnection, *, name: str, holder: str) -> None:
    await conn.execute(JOB_SQL["lease_release"], {"name": name, "holder": holder})


async def job_release_orphans(
    conn: AsyncConnection, *, worker: str, known: list[UUID], min_age_secs: float
) -> list[UUID]:
    result = await conn.execute(
        JOB_SQL["job_release_orphans"],
        {"worker": worker, "known": known, "min_age_secs": min_age_secs},
    )
    return [row[0] for row in result.fetchall()]


async def _driver(conn: AsyncConnection | psycopg.AsyncConnection[Any]
                  ) -> psycopg.AsyncConnection[Any]:
    """The psycopg connection beneath `conn`."""
    if isinstance(conn, psycopg.AsyncConnection):
        return conn
    raw = await conn.get_raw_connection()
    return cast(psycopg.AsyncConnection[Any], raw.driver_connection)
