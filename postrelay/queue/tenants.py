"""Tenants: every job belongs to exactly one."""

from __future__ import annotations

from collections.abc import Awaitable
from uuid import UUID

from postrelay.core.dbcall import AnyConnection, Steps, drive
from postrelay.core.errors import ValidationError
from postrelay.queue.queries import Q


def ensure_tenant(conn: AnyConnection, name: str) -> UUID | Awaitable[UUID]:
    """Return the id of the tenant called `name`, creating it in the caller's transaction."""
    if not isinstance(name, str) or not name.strip():
        raise ValidationError("name", "a tenant name must be a non-empty string")
    return drive(conn, _ensure_steps(name.strip()))


def _ensure_steps(name: str) -> Steps[UUID]:
    rows = yield Q["tenant_upsert"], {"name": name}
    return rows[0][0]  # type: ignore[no-any-return]
