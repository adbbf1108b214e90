"""What the operator set stays the operator's. A tenant key (over the API, or in a
dashboard session) works the flow controls of its own tenant, but lifts no pause and
changes no limit the operator made (the service role, the CLI, a worker's
POSTRELAY_SMTP_RATE): pausing or limiting a tenant is how an operator stops one that
floods a shared destination. Nor does it set a limit of its own on a kind the operator
limited for every tenant: a tenant's own limit governs its jobs instead of the kind-wide
one, so it would take them out of the cap every tenant shares (the SMTP server's rate).
The other order is queue.limit_set's: a kind-wide limit removes those tenant keys set.

    check_resume(conn, tenant_id=acme, kind="email_send")  # ForbiddenError: the operator's
"""

from __future__ import annotations

from uuid import UUID

from sqlalchemy import Connection

from postrelay.core.errors import ForbiddenError
from postrelay.queue import limit_list, made_by_tenant_key, pause_list


def check_resume(conn: Connection, *, tenant_id: UUID, kind: str | None) -> None:
    """ForbiddenError (`operator_pause`) when the operator paused this scope of the tenant."""
    for held in pause_list(conn, tenant_id=tenant_id):
        if held.tenant_id == tenant_id and held.kind == kind \
                and not made_by_tenant_key(held.paused_by):
            raise ForbiddenError("operator_pause", f"{held.describe()} was paused by "
                                 f"{held.paused_by}; only the operator resumes it")


def check_limit_change(conn: Connection, *, tenant_id: UUID, kind: str, setting: bool) -> None:
    """ForbiddenError when a tenant key may not set (`setting`) or remove its tenant's limit
    of `kind`: `operator_limit` when the operator set that limit, `kind_wide_limit` when a
    new one would take the tenant's jobs out of the kind-wide limit."""
    for found in limit_list(conn, tenant_id=tenant_id):
        if found.kind != kind:
            continue
        if found.tenant_id == tenant_id and not made_by_tenant_key(found.created_by):
            raise ForbiddenError("operator_limit", f"{found.describe()} was set by "
                                 f"{found.created_by}; only the operator changes it")
        if found.tenant_id is None and setting:
            raise ForbiddenError("kind_wide_limit", f"{found.describe()} holds every "
                                 "tenant's jobs; a limit of this tenant's own would take "
                                 "its jobs out of it, so only the operator sets one")
