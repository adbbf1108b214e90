"""One thin typed function per statement of `sql/email.sql`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from sqlalchemy import Connection, TextClause
from sqlalchemy.ext.asyncio import AsyncConnection

from postrelay.core import jsontext
from postrelay.core.dbcall import driver_fetch
from postrelay.core.sqlfiles import load_queries
from postrelay.orchestrator.attempts import Logged, Rescue, SendCheck

EMAIL_SQL = load_queries("postrelay.orchestrator", "sql/email.sql")


async def email_send_check_many(
    conn: AsyncConnection | psycopg.AsyncConnection[Any], rows: Sequence[dict[str, Any]]
) -> dict[str, SendCheck]:
    """Each row's `SendCheck`, by its `job_id` (as text). A row carries the log row's
    `job_id`, `tenant_id` and `recipients`."""
    result = await driver_fetch(conn, EMAIL_SQL["email_send_check_many"],
                                {"rows": jsontext.encode_rows(rows)})
    return {job_id: SendCheck(
                logged=tuple(Logged(UUID(r["id"]), r["attempt"], r["status"],
                                    datetime.fromisoformat(r["created_at"]))
                             for r in logged or ()),
                rescues=tuple(Rescue(int(r["attempt"]), _moment(r["claimed_at"]),
                                     datetime.fromisoformat(r["created_at"]))
                              for r in lost or ()),
                released_at=released_at,
                suppressions=frozenset((kind, address) for kind, address in suppressed))
            for job_id, logged, lost, released_at, suppressed, _ in result}


def _moment(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value is not None else None


async def email_event_contexts(conn: AsyncConnection, *, tenant_ids: Sequence[UUID],
                               event_ids: Sequence[UUID]) -> list[tuple[Any, ...]]:
    """The events named by the pairs (tenant_ids[i], event_ids[i]) that exist: id, tenant,
    aggregate type and id, type, payload, created_at, and the payload's size in bytes."""
    return await driver_fetch(conn, EMAIL_SQL["email_event_contexts"], {
        "tenant_ids": list(tenant_ids), "event_ids": list(event_ids)})


async def tenant_name(conn: AsyncConnection, *, tenant_id: UUID) -> str | None:
    result = await conn.execute(EMAIL_SQL["tenant_name"], {"tenant_id": tenant_id})
    return result.scalar_one_or_none()


# The effect writers' statements: the completer runs them in the transaction of the jobs'
# outcomes (queue/effects.py).
def email_log_upsert_many(rows: Sequence[dict[str, Any]]) -> tuple[TextClause, Any]:
    return EMAIL_SQL["email_log_upsert_many"], {"rows": jsontext.encode_rows(rows)}


def email_log_add_lost_many(rows: Sequence[dict[str, Any]]) -> tuple[TextClause, Any]:
    return EMAIL_SQL["email_log_add_lost_many"], {"rows": jsontext.encode_rows(rows)}


def email_suppression_add_many(rows: Sequence[dict[str, Any]]) -> tuple[TextClause, Any]:
    return EMAIL_SQL["email_suppression_add_many"], {"rows": jsontext.encode_rows(rows)}


def email_suppression_list(conn: Connection, **params: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(EMAIL_SQL["email_suppression_list"],
                                          params).mappings()]


def email_log_list(conn: Connection, **filters: Any) -> list[dict[str, Any]]:
    narrowed = any(filters[f] is not None for f in ("recipient", "event_id", "job_id"))
    if narrowed:
        statement = EMAIL_SQL["email_log_list"]
    elif filters["status"] is not None:
        statement = EMAIL_SQL["email_log_list_status"]
    elif filters["tenant_id"] is not None:
        statement = EMAIL_SQL["email_log_list"]
    else:
        statement = EMAIL_SQL["email_log_list_recent"]
    return [dict(r) for r in conn.execute(statement, filters).mappings()]


def email_story(conn: Connection, *, log_id: UUID | str, tenant_id: UUID | str | None
                ) -> dict[str, Any] | None:
    row = conn.execute(EMAIL_SQL["email_story"], {
        "log_id": str(log_id), "tenant_id": str(tenant_id) if tenant_id else None,
    }).mappings().first()
    return dict(row) if row else None
