"""What the system keeps for itself: the job kinds a tenant may not enqueue or schedule,
and the cron names no caller may create. The one place these rules are written; the API,
the dashboard and `cron_create` ask here.

System kinds (`cleanup_jobs`) do maintenance across every tenant's rows (retention). They
run only in the system tenant, from the built-in `postrelay.*` cron entries that migrations
create. A tenant key may never enqueue or schedule them; the service-role key and the CLI
(the installation's operators) only in the system tenant, where running retention early is
harmless: the handler takes its windows from the settings, never from the payload.

Trusted kinds (`email_send`, `outbox_dispatch`) carry payloads that speak for the
installation: an email's From and the domain of its Message-ID, the SMTP server it goes
through, the outbox event and webhook endpoint a delivery reads. Their payloads are
written by trusted code only: email routes and `enqueue_email` in the application,
the relay's webhook route. A tenant key may not enqueue or schedule them through the HTTP
API or the dashboard (mail goes out through email routes, webhooks through the relay); the
service-role key may, for any tenant.

Cron names starting `postrelay.` belong to the built-in entries that migrations create in
the system tenant. Nobody creates or deletes one through `cron_create`/`cron_delete`
(API, dashboard, CLI or library): retention is configured with its settings instead.
"""

from __future__ import annotations

from uuid import UUID

from postrelay.core.errors import ForbiddenError
from postrelay.queue.schema import SYSTEM_TENANT_ID

SYSTEM_KINDS = frozenset({"cleanup_jobs"})
TRUSTED_KINDS = frozenset({"email_send", "outbox_dispatch"})
# What a tenant key may not enqueue or schedule.
TENANT_FORBIDDEN_KINDS = SYSTEM_KINDS | TRUSTED_KINDS
RESERVED_CRON_PREFIX = "postrelay."

KIND_RESERVED = "kind_reserved"
NAME_RESERVED = "name_reserved"


def check_kind(kind: str, tenant_id: UUID, *, tenant_key: bool) -> None:
    """Raise ForbiddenError when this caller may not enqueue or schedule `kind` for
    `tenant_id`. `tenant_key`: the caller is a tenant key (API or dashboard session)."""
    if tenant_key and kind in SYSTEM_KINDS:
        raise ForbiddenError(KIND_RESERVED, f"kind {kind!r} is reserved for the system; "
                                            "tenant keys may not enqueue it")
    if tenant_key and kind in TRUSTED_KINDS:
        raise ForbiddenError(KIND_RESERVED, f"kind {kind!r} is reserved for trusted code "
                                            "(email routes, enqueue_email, the relay); tenant "
                                            "keys may not enqueue it")
    check_system_kind_tenant(kind, tenant_id)


def check_system_kind_tenant(kind: str, tenant_id: UUID) -> None:
    """A system kind runs in the system tenant only, whoever asks."""
    if kind in SYSTEM_KINDS and tenant_id != SYSTEM_TENANT_ID:
        raise ForbiddenError(KIND_RESERVED, f"kind {kind!r} is reserved for the system: it "
                                            "runs only in the system tenant")


def check_cron_name(name: str) -> None:
    """Raise ForbiddenError for a name in the built-in entries' namespace."""
    if name.startswith(RESERVED_CRON_PREFIX):
        raise ForbiddenError(NAME_RESERVED, f"cron names starting {RESERVED_CRON_PREFIX!r} are "
                                            "reserved for the system's built-in entries")
