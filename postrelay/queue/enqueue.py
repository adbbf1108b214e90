"""Enqueue jobs inside the caller's transaction (jobspec.py checks them first).

Every function takes the caller's connection or session and never commits it: the job
exists only if the caller commits. `enqueue` and `enqueue_many` take a sync SQLAlchemy
Connection or Session or a psycopg connection; `enqueue_async` and `enqueue_many_async` the
async ones. Both kinds run the same steps (`_enqueue_steps`, `_enqueue_many_steps`).

    with engine.begin() as conn:
        conn.execute(orders.insert().values(...))
        job_id = enqueue(conn, "reindex", {"order": 42}, tenant_id=tenant)

    async with async_engine.begin() as conn:
        job_id = await enqueue_async(conn, "reindex", {"order": 42}, tenant_id=tenant)
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, overload
from uuid import UUID

from typing_extensions import deprecated

from postrelay.core import jsontext
from postrelay.core.bulkcopy import Copy
from postrelay.core.dbcall import (
    AnyConnection,
    AsyncAnyConnection,
    Steps,
    SyncConnection,
    run_async,
    run_sync_or_deprecated_async,
)
from postrelay.core.errors import ValidationError
from postrelay.core.ids import new_uuid, new_uuids
from postrelay.core.limits import checked_created_by, each_of, max_payload_bytes
from postrelay.core.notify import NotifyOnce
from postrelay.queue.jobspec import (
    RELAY_KEY_PREFIX,
    JobSpec,
    ValidatedJob,
    validated_job,
)
from postrelay.queue.queries import JOB_SQL

_wakeup = NotifyOnce("postrelay_jobs")
# The columns of job_copy_in; an enum travels in binary COPY as its label's text.
JOB_COPY_TYPES = (
    "uuid", "uuid", "text", "jsonb", "int2", "timestamptz", "int4", "text", "text",
)


@overload
def enqueue(
    conn: SyncConnection, kind: str, payload: Mapping[str, Any], *, tenant_id: UUID | str,
    priority: int = ..., delay: float | timedelta | None = ..., run_at: datetime | None = ...,
    max_attempts: int | None = ..., idempotency_key: str | None = ...,
    created_by: str | None = ..., notify: bool = ...,
) -> UUID: ...
@overload
@deprecated("enqueue on an async connection: await enqueue_async(conn, ...) instead")
def enqueue(
    conn: AsyncAnyConnection, kind: str, payload: Mapping[str, Any], *, tenant_id: UUID | str,
    priority: int = ..., delay: float | timedelta | None = ..., run_at: datetime | None = ...,
    max_attempts: int | None = ..., idempotency_key: str | None = ...,
    created_by: str | None = ..., notify: bool = ...,
) -> Coroutine[Any, Any, UUID]: ...
def enqueue(
    conn: AnyConnection,
    kind: str,
    payload: Mapping[str, Any],
    *,
    tenant_id: UUID | str,
    priority: int = 100,
    delay: float | timedelta | None = None,
    run_at: datetime | None = None,
    max_attempts: int | None = None,
    idempotency_key: str | None = None,
    created_by: str | None = None,
    notify: bool = True,
) -> UUID | Coroutine[Any, Any, UUID]:
    """Insert one job in the caller's transaction and return its id.

    A second enqueue with the same `(tenant_id, kind, idempotency_key)` returns the first
    job's id and writes nothing. `max_attempts` defaults to POSTRELAY_JOB_MAX_RETRIES (8).
    Bad input raises ValidationError naming the field before anything is written. On an
    async connection, `await enqueue_async(...)`.
    """
    row = _job_row(kind, payload, tenant_id, priority, delay, run_at, max_attempts,
                   idempotency_key, created_by)
    return run_sync_or_deprecated_async(
        conn, _enqueue_steps(conn, row, _wakeup.wanted(conn, notify)), async_name="enqueue_async")


async def enqueue_async(
    conn: AsyncAnyConnection,
    kind: str,
    payload: Mapping[str, Any],
    *,
    tenant_id: UUID | str,
    priority: int = 100,
    delay: float | timedelta | None = None,
    run_at: datetime | None = None,
    max_attempts: int | None = None,
    idempotency_key: str | None = None,
    created_by: str | None = None,
    notify: bool = True,
) -> UUID:
    """`enqueue` on an async SQLAlchemy Connection or Session or an async psycopg connection:

        async with engine.begin() as conn:
            job_id = await enqueue_async(conn, "reindex", {"order": 42}, tenant_id=tenant)
    """
    row = _job_row(kind, payload, tenant_id, priority, delay, run_at, max_attempts,
                   idempotency_key, created_by)
    return await run_async(conn, _enqueue_steps(conn, row, _wakeup.wanted(conn, notify)))


def _job_row(
    kind: str, payload: Mapping[str, Any], tenant_id: UUID | str, priority: int,
    delay: float | timedelta | None, run_at: datetime | None, max_attempts: int | None,
    idempotency_key: str | None, created_by: str | None,
) -> ValidatedJob:
    """The row job_insert takes: the job checked, its creator and a new id."""
    row = validated_job(kind, payload, tenant_id, priority, delay, run_at, max_attempts,
                        idempotency_key)
    row["created_by"] = checked_created_by(created_by)
    row["id"] = new_uuid()
    return row


def _enqueue_steps(conn: AnyConnection, row: ValidatedJob, send_notify: bool) -> Steps[UUID]:
    with_notify = send_notify and _wakeup.needed(conn)
    row["notify"] = with_notify
    written = yield JOB_SQL["job_insert"], row
    if written:
        if with_notify:
            _wakeup.mark(conn)  # the transaction exists now, even if this statement began it
        return row["id"]  # type: ignore[no-any-return]
    (diagnosis,) = yield JOB_SQL["job_insert_diagnose"], row
    tenant_exists, kind_exists, existing_id = diagnosis
    if not tenant_exists:
        raise ValidationError("tenant_id", f"no tenant with id {row['tenant_id']}")
    if not kind_exists:
        raise ValidationError(
            "kind", f"unknown job kind {row['kind']!r} (add it with `postrelay kinds add`)"
        )
    if existing_id is None:  # the competing transaction rolled back after blocking us: retry
        return (yield from _enqueue_steps(conn, row, send_notify))
    return existing_id  # type: ignore[no-any-return]


@overload
def enqueue_many(
    conn: SyncConnection, jobs: Iterable[JobSpec], *, created_by: str | None = ...,
    notify: bool = ...,
) -> list[UUID]: ...
@overload
@deprecated("enqueue_many on an async connection: await enqueue_many_async(conn, ...) instead")
def enqueue_many(
    conn: AsyncAnyConnection, jobs: Iterable[JobSpec], *, created_by: str | None = ...,
    notify: bool = ...,
) -> Coroutine[Any, Any, list[UUID]]: ...
def enqueue_many(
    conn: AnyConnection,
    jobs: Iterable[JobSpec],
    *,
    created_by: str | None = None,
    notify: bool = True,
) -> list[UUID] | Coroutine[Any, Any, list[UUID]]:
    """Insert many jobs in one round trip; returns their ids in input order.

    A job whose idempotency key is taken gets the existing job's id. If any job is invalid
    (or names an unknown tenant or kind) nothing is written. On an async connection,
    `await enqueue_many_async(...)`.
    """
    steps = _enqueue_many_steps(conn, _validated_specs(jobs), checked_created_by(created_by),
                                _wakeup.wanted(conn, notify))
    return run_sync_or_deprecated_async(conn, steps, async_name="enqueue_many_async")


async def enqueue_many_async(
    conn: AsyncAnyConnection,
    jobs: Iterable[JobSpec],
    *,
    created_by: str | None = None,
    notify: bool = True,
) -> list[UUID]:
    """`enqueue_many` on an async connection or session."""
    steps = _enqueue_many_steps(conn, _validated_specs(jobs), checked_created_by(created_by),
                                _wakeup.wanted(conn, notify))
    return await run_async(conn, steps)


def _validated_specs(jobs: Iterable[JobSpec]) -> list[ValidatedJob]:
    max_bytes = max_payload_bytes()  # once per batch, not per job
    return [
        validated_job(s.kind, s.payload, s.tenant_id, s.priority, s.delay, s.run_at,
                      s.max_attempts, s.idempotency_key, index=i, max_bytes=max_bytes)
        for i, s in each_of(jobs, JobSpec, "jobs")
    ]


async def enqueue_validated_async(
    conn: AsyncAnyConnection,
    rows: list[ValidatedJob],
    *,
    created_by: str | None = None,
    notify: bool = True,
    ids: list[UUID] | None = None,
) -> list[UUID]:
    """`enqueue_many_async` for jobs that `validated_job` has already checked one by one: a
    writer that must set a bad job aside, not refuse the whole batch (the relay), checks
    each itself. Unknown tenants and kinds are still refused here, and nothing written.
    `ids`: the new jobs' ids, when the caller has named them already (the relay links each
    job to its event before making it)."""
    return await run_async(conn, _enqueue_many_steps(
        conn, rows, checked_created_by(created_by), _wakeup.wanted(conn, notify), ids))


def _enqueue_many_steps(
    conn: AnyConnection, rows: list[ValidatedJob], created_by: str | None, send_notify: bool,
    ids: list[UUID] | None = None,
) -> Steps[list[UUID]]:
    if not rows:
        return []
    tenant_ids = list({r["tenant_id"] for r in rows})
    kinds = list({r["kind"] for r in rows})
    with_notify = send_notify and _wakeup.needed(conn)
    ((missing_tenants, unknown_kinds, now, _notified),) = yield JOB_SQL["job_batch_check"], {
        "tenant_ids": tenant_ids, "kinds": kinds, "notify": with_notify,
    }
    if with_notify:
        _wakeup.mark(conn)  # the transaction exists now, even if this statement began it
    if missing_tenants:
        raise ValidationError("tenant_id", f"no tenant with id {missing_tenants[0]}")
    if unknown_kinds:
        raise ValidationError("kind", f"unknown job kind {unknown_kinds[0]!r}")
    ids = new_uuids(len(rows)) if ids is None else ids
    # Only keys in job_idempotency_uk can be taken (the relay's links keep its own unique).
    guarded = any(r["idempotency_key"] is not None
                  and not r["idempotency_key"].startswith(RELAY_KEY_PREFIX) for r in rows)
    copied = yield Copy(JOB_SQL["job_copy_in"].text, JOB_COPY_TYPES,
                        _copy_rows(ids, rows, now, created_by), guarded=guarded)
    if copied is not None:
        inserted: Sequence[Any] = ids
    else:  # a key is taken (a replay, a retried batch): insert what is new, find the rest
        inserted = yield JOB_SQL["job_insert_many"], {
            "rows": _rows_document(ids, rows), "created_by": created_by,
        }
        if len(inserted) < len(rows):
            ids = yield from _resolve_taken_keys(rows, ids, {r[0] for r in inserted})
    return ids


def _rows_document(ids: list[UUID], rows: list[ValidatedJob]) -> str:
    """The batch as one JSON array of arrays for job_insert_many, in its column order."""
    return jsontext.encode([
        [str(job_id), str(r["tenant_id"]), r["kind"], r["priority"],
         None if r["run_at"] is None else r["run_at"].isoformat(), r["delay"],
         r["max_attempts"], r["idempotency_key"], jsontext.decode(r["payload"])]
        for job_id, r in zip(ids, rows, strict=True)
    ])


def _copy_rows(ids: list[UUID], rows: list[ValidatedJob], now: datetime,
               created_by: str | None) -> Iterator[tuple[Any, ...]]:
    """The rows for job_copy_in. A delay counts from the transaction's now(), as it does in
    job_insert_many, so a copied job is due exactly when an inserted one would be."""
    for job_id, r in zip(ids, rows, strict=True):
        due = r["run_at"] or (now + timedelta(seconds=r["delay"]) if r["delay"] else now)
        yield (job_id, r["tenant_id"], r["kind"], r["payload"], r["priority"], due,
               r["max_attempts"], r["idempotency_key"], created_by)


def _resolve_taken_keys(
    rows: list[ValidatedJob], ids: list[UUID], inserted: set[UUID]
) -> Steps[list[UUID]]:
    """Replace the ids of rows skipped for a taken idempotency key by the existing jobs'."""
    resolved = list(ids)
    skipped: dict[tuple[Any, str], list[int]] = {}
    for i, (row, job_id) in enumerate(zip(rows, ids, strict=True)):
        if job_id not in inserted:
            skipped.setdefault((row["tenant_id"], row["kind"]), []).append(i)
    for (tenant_id, kind), positions in skipped.items():
        keys = [rows[i]["idempotency_key"] for i in positions]
        found = yield JOB_SQL["job_find_by_keys"], {
            "tenant_id": tenant_id, "kind": kind, "keys": keys}
        by_key = {key: job_id for key, job_id in found}
        for i in positions:
            resolved[i] = by_key.get(rows[i]["idempotency_key"], resolved[i])
    return resolved


@overload
def job_kinds(conn: SyncConnection) -> list[str]: ...
@overload
@deprecated("job_kinds on an async connection: await job_kinds_async(conn) instead")
def job_kinds(conn: AsyncAnyConnection) -> Coroutine[Any, Any, list[str]]: ...
def job_kinds(conn: AnyConnection) -> list[str] | Coroutine[Any, Any, list[str]]:
    """The values of the mdm.job_kind enum, in order. On an async connection,
    `await job_kinds_async(...)`."""
    return run_sync_or_deprecated_async(conn, _kinds_steps(), async_name="job_kinds_async")


async def job_kinds_async(conn: AsyncAnyConnection) -> list[str]:
    """`job_kinds` on an async connection or session."""
    return await run_async(conn, _kinds_steps())


def _kinds_steps() -> Steps[list[str]]:
    rows = yield JOB_SQL["job_kinds"], {}
    return [row[0] for row in rows]
