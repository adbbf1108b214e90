"""Write outbox events inside the caller's transaction.

    with engine.begin() as conn:
        conn.execute(orders.insert().values(id=42))
        emit(conn, "order.placed", {"total": 99}, tenant_id=tenant,
             aggregate_type="order", aggregate_id="42")

The event exists only if the caller commits. On an async connection or session, the same
with `await emit_async(...)` (and `emit_many_async`). At most one NOTIFY is sent per
transaction to wake the relays.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass
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
from postrelay.core.limits import (
    MAX_NAME_CHARS,
    checked_created_by,
    checked_text,
    each_of,
    max_payload_bytes,
)
from postrelay.core.notify import NotifyOnce
from postrelay.relay.queries import OUTBOX_SQL

_wakeup = NotifyOnce("postrelay_outbox")
# The columns of outbox_copy_in.
OUTBOX_COPY_TYPES = ("uuid", "uuid", "text", "text", "text", "jsonb", "jsonb", "text")
# Smaller batches go in with one INSERT (outbox_insert_many), larger ones with COPY.
COPY_MIN_EVENTS = 20


@overload
def emit(
    conn: SyncConnection, event_type: str, payload: Mapping[str, Any], *,
    tenant_id: UUID | str, aggregate_type: str, aggregate_id: str | int | UUID,
    headers: Mapping[str, Any] | None = ..., created_by: str | None = ..., notify: bool = ...,
) -> UUID: ...
@overload
@deprecated("emit on an async connection: await emit_async(conn, ...) instead")
def emit(
    conn: AsyncAnyConnection, event_type: str, payload: Mapping[str, Any], *,
    tenant_id: UUID | str, aggregate_type: str, aggregate_id: str | int | UUID,
    headers: Mapping[str, Any] | None = ..., created_by: str | None = ..., notify: bool = ...,
) -> Coroutine[Any, Any, UUID]: ...
def emit(
    conn: AnyConnection,
    event_type: str,
    payload: Mapping[str, Any],
    *,
    tenant_id: UUID | str,
    aggregate_type: str,
    aggregate_id: str | int | UUID,
    headers: Mapping[str, Any] | None = None,
    created_by: str | None = None,
    notify: bool = True,
) -> UUID | Coroutine[Any, Any, UUID]:
    """Insert one outbox event in the caller's transaction and return its id. Bad input
    raises ValidationError naming the field, before anything is written. On an async
    connection, `await emit_async(...)`."""
    row = _validated(event_type, payload, tenant_id, aggregate_type, aggregate_id, headers,
                     created_by, max_payload_bytes())
    row["id"] = new_uuid()
    return run_sync_or_deprecated_async(
        conn, _emit_steps(conn, row, _wakeup.wanted(conn, notify)), async_name="emit_async")


async def emit_async(
    conn: AsyncAnyConnection,
    event_type: str,
    payload: Mapping[str, Any],
    *,
    tenant_id: UUID | str,
    aggregate_type: str,
    aggregate_id: str | int | UUID,
    headers: Mapping[str, Any] | None = None,
    created_by: str | None = None,
    notify: bool = True,
) -> UUID:
    """`emit` on an async SQLAlchemy Connection or Session or an async psycopg connection:

        async with engine.begin() as conn:
            await emit_async(conn, "order.placed", {"total": 99}, tenant_id=tenant,
                             aggregate_type="order", aggregate_id="42")
    """
    row = _validated(event_type, payload, tenant_id, aggregate_type, aggregate_id, headers,
                     created_by, max_payload_bytes())
    row["id"] = new_uuid()
    return await run_async(conn, _emit_steps(conn, row, _wakeup.wanted(conn, notify)))


def _emit_steps(conn: AnyConnection, row: dict[str, Any], send_notify: bool) -> Steps[UUID]:
    with_notify = send_notify and _wakeup.needed(conn)
    row["notify"] = with_notify
    written = yield OUTBOX_SQL["outbox_insert"], row
    if not written:
        raise ValidationError("tenant_id", f"no tenant with id {row['tenant_id']}")
    if with_notify:
        _wakeup.mark(conn)
    return row["id"]  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class EventSpec:
    """One event for `emit_many`; the fields mean what `emit`'s arguments mean."""

    event_type: str
    payload: Mapping[str, Any]
    tenant_id: UUID | str
    aggregate_type: str
    aggregate_id: str | int | UUID
    headers: Mapping[str, Any] | None = None


@overload
def emit_many(
    conn: SyncConnection, events: Iterable[EventSpec], *, created_by: str | None = ...,
    notify: bool = ...,
) -> list[UUID]: ...
@overload
@deprecated("emit_many on an async connection: await emit_many_async(conn, ...) instead")
def emit_many(
    conn: AsyncAnyConnection, events: Iterable[EventSpec], *, created_by: str | None = ...,
    notify: bool = ...,
) -> Coroutine[Any, Any, list[UUID]]: ...
def emit_many(
    conn: AnyConnection,
    events: Iterable[EventSpec],
    *,
    created_by: str | None = None,
    notify: bool = True,
) -> list[UUID] | Coroutine[Any, Any, list[UUID]]:
    """Insert many events, in order, and return their ids. If any event is invalid or names
    an unknown tenant, nothing is written. A batch of COPY_MIN_EVENTS or more streams in
    with binary COPY on the psycopg connection beneath `conn`, in its transaction; a
    smaller one goes in with one INSERT. On an async connection,
    `await emit_many_async(...)`."""
    steps = _emit_many_steps(conn, _validated_specs(events, created_by), created_by,
                             _wakeup.wanted(conn, notify))
    return run_sync_or_deprecated_async(conn, steps, async_name="emit_many_async")


async def emit_many_async(
    conn: AsyncAnyConnection,
    events: Iterable[EventSpec],
    *,
    created_by: str | None = None,
    notify: bool = True,
) -> list[UUID]:
    """`emit_many` on an async connection or session."""
    steps = _emit_many_steps(conn, _validated_specs(events, created_by), created_by,
                             _wakeup.wanted(conn, notify))
    return await run_async(conn, steps)


def _validated_specs(events: Iterable[EventSpec], created_by: str | None) -> list[dict[str, Any]]:
    # The batch's own argument, checked once and named as itself, not as an event's field.
    checked_created_by(created_by)
    rows = []
    max_bytes = max_payload_bytes()  # once per batch: the environment is slow to ask
    for i, e in each_of(events, EventSpec, "events"):
        try:
            rows.append(_validated(e.event_type, e.payload, e.tenant_id, e.aggregate_type,
                                   e.aggregate_id, e.headers, None, max_bytes))
        except ValidationError as exc:
            raise ValidationError(f"events[{i}].{exc.field}", exc.rule) from None
    return rows


def _emit_many_steps(
    conn: AnyConnection, rows: list[dict[str, Any]], created_by: str | None, send_notify: bool
) -> Steps[list[UUID]]:
    if not rows:
        return []
    with_notify = send_notify and _wakeup.needed(conn)
    ids = new_uuids(len(rows))
    if len(rows) < COPY_MIN_EVENTS:
        ((missing,),) = yield OUTBOX_SQL["outbox_insert_many"], {
            "rows": jsontext.encode_rows([{
                "id": event_id, "tenant_id": r["tenant_id"],
                "aggregate_type": r["aggregate_type"], "aggregate_id": r["aggregate_id"],
                "event_type": r["event_type"], "payload": r["payload"],
                "headers": r["headers"]} for event_id, r in zip(ids, rows, strict=True)]),
            "created_by": created_by, "notify": with_notify}
        if missing:
            raise ValidationError("tenant_id", f"no tenant with id {missing[0]}")
        if with_notify:
            _wakeup.mark(conn)
        return ids
    ((missing, _notified),) = yield OUTBOX_SQL["outbox_batch_check"], {
        "tenant_ids": list({r["tenant_id"] for r in rows}), "notify": with_notify,
    }
    if with_notify:
        _wakeup.mark(conn)
    if missing:
        raise ValidationError("tenant_id", f"no tenant with id {missing[0]}")
    yield Copy(OUTBOX_SQL["outbox_copy_in"].text, OUTBOX_COPY_TYPES, (
        (event_id, r["tenant_id"], r["aggregate_type"], r["aggregate_id"], r["event_type"],
         r["payload"], r["headers"], created_by)
        for event_id, r in zip(ids, rows, strict=True)))
    return ids


def _validated(
    event_type: str,
    payload: Mapping[str, Any],
    tenant_id: UUID | str,
    aggregate_type: str,
    aggregate_id: str | int | UUID,
    headers: Mapping[str, Any] | None,
    created_by: str | None,
    max_bytes: int,
) -> dict[str, Any]:
    """One event's fields checked and in the form the inserts take. Everything PostgreSQL
    would refuse is refused here (core/limits.py), so a ValidationError leaves the
    caller's transaction usable."""
    if not isinstance(event_type, str) or not event_type.strip():
        raise ValidationError("event_type", "must be a non-empty string")
    if not isinstance(payload, Mapping):
        raise ValidationError("payload", f"must be a JSON object, got {type(payload).__name__}")
    if headers is not None and not isinstance(headers, Mapping):
        raise ValidationError("headers", "must be a JSON object or None")
    if tenant_id is None:
        raise ValidationError("tenant_id", "is required")
    try:
        tenant = tenant_id if isinstance(tenant_id, UUID) else UUID(str(tenant_id))
    except ValueError:
        raise ValidationError("tenant_id", f"must be a UUID, got {tenant_id!r}") from None
    if not isinstance(aggregate_type, str) or not aggregate_type:
        raise ValidationError("aggregate_type", "must be a non-empty string")
    if isinstance(aggregate_id, bool) or not isinstance(aggregate_id, str | int | UUID | None):
        # str() of anything else is its repr: an ORM object's `<Order object at 0x…>`
        raise ValidationError("aggregate_id", "must be a string, an integer or a UUID, got "
                                              f"{type(aggregate_id).__name__}")
    aggregate = aggregate_id if isinstance(aggregate_id, str) else (
        None if aggregate_id is None else str(aggregate_id))
    if not aggregate:
        raise ValidationError("aggregate_id", "is required")
    if created_by is not None and not isinstance(created_by, str):
        raise ValidationError("created_by", "must be a string")
    names = event_type + aggregate_type + aggregate + (created_by or "")
    if (len(event_type) > MAX_NAME_CHARS or len(aggregate_type) > MAX_NAME_CHARS
            or len(aggregate) > MAX_NAME_CHARS or not names.isascii() or "\x00" in names):
        # The close look, only when the one cheap test over all four failed.
        checked_text(event_type, "event_type", MAX_NAME_CHARS)
        checked_text(aggregate_type, "aggregate_type", MAX_NAME_CHARS)
        checked_text(aggregate, "aggregate_id", MAX_NAME_CHARS)
        checked_text(created_by or "", "created_by")
    return {
        "event_type": event_type,
        "payload": jsontext.encode_document(payload, "payload", max_bytes),
        "headers": jsontext.encode_document(headers, "headers", max_bytes) if headers else "{}",
        "tenant_id": tenant,
        "aggregate_type": aggregate_type,
        "aggregate_id": aggregate,
        "created_by": created_by,
    }
