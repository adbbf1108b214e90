"""Tenants: every job belongs to exactly one."""

from __future__ import annotations

import unicodedata
from collections.abc import Coroutine
from typing import Any, overload
from uuid import UUID

from typing_extensions import deprecated

from postrelay.core.dbcall import (
    AnyConnection,
    AsyncAnyConnection,
    Steps,
    SyncConnection,
    run_async,
    run_sync_or_deprecated_async,
)
from postrelay.core.errors import ValidationError
from postrelay.core.limits import MAX_NAME_CHARS, checked_text
from postrelay.queue.queries import JOB_SQL


@overload
def ensure_tenant(conn: SyncConnection, name: str) -> UUID: ...
@overload
@deprecated("ensure_tenant on an async connection: await ensure_tenant_async(conn, ...) instead")
def ensure_tenant(conn: AsyncAnyConnection, name: str) -> Coroutine[Any, Any, UUID]: ...
def ensure_tenant(conn: AnyConnection, name: str) -> UUID | Coroutine[Any, Any, UUID]:
    """Return the id of the tenant called `name`, creating it in the caller's transaction.
    On an async connection, `await ensure_tenant_async(...)`."""
    return run_sync_or_deprecated_async(conn, _ensure_steps(_checked_name(name)),
                                        async_name="ensure_tenant_async")


async def ensure_tenant_async(conn: AsyncAnyConnection, name: str) -> UUID:
    """`ensure_tenant` on an async connection or session."""
    return await run_async(conn, _ensure_steps(_checked_name(name)))


def _checked_name(name: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValidationError("name", "a tenant name must be a non-empty string")
    name = checked_text(name.strip(), "name", MAX_NAME_CHARS)
    # A name is typed as `--tenant NAME` and shown in one table cell.
    if not name.isprintable() and any(unicodedata.category(c) == "Cc" for c in name):
        raise ValidationError("name", "must not contain control characters (a line break, "
                                      "a tab, a terminal escape)")
    return name


def _ensure_steps(name: str) -> Steps[UUID]:
    rows = yield JOB_SQL["tenant_upsert"], {"name": name}
    while not rows:  # another transaction made it after the statement began: read it now
        rows = yield JOB_SQL["tenant_upsert"], {"name": name}
    tenant_id: UUID = rows[0][0]
    return tenant_id
