"""The webhook tables as SQLAlchemy metadata (created by migration 0005).

`aa_webhook_endpoint` holds a tenant's receivers; `aa_webhook_attempt` is the delivery log,
one row per HTTP attempt. An attempt keeps `job_id` without a foreign key: jobs are deleted
by retention long before anyone stops caring why a delivery failed. `event_id` and `job_id`
join it to `aa_outbox_event` and `aa_outbox_delivery`, so one query follows an event to its
jobs and their attempts.
"""

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    ForeignKey,
    Identity,
    Index,
    Integer,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, UUID

from postrelay.core.db import TIMESTAMPTZ, metadata

# Deleting a tenant deletes its endpoints, and an endpoint its attempts: both are
# configuration and history of something that no longer exists.
webhook_endpoint = Table(
    "aa_webhook_endpoint",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()")),
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE"),
           nullable=False),
    Column("url", Text, nullable=False),
    # `whsec_` + base64 of the key: Standard Webhooks' symmetric secret. HMAC needs the key
    # itself, so it cannot be stored hashed; it is shown once, when the endpoint is added.
    Column("secret", Text, nullable=False),
    # Glob patterns (`order.*`); NULL or empty means every event type.
    Column("event_types", ARRAY(Text)),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
    Column("disabled_reason", Text),
    # Who disabled it: 'operator' (the CLI, the service-role key, code without a tenant),
    # 'tenant' (a tenant key) or 'receiver' (a 410 Gone); NULL while enabled. A tenant key
    # enables no endpoint an operator disabled (migration 0034).
    Column("disabled_by", Text),
    Column("created_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Column("updated_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    # A private CA's certificates (PEM), trusted instead of the default bundle for this
    # endpoint's HTTPS (trust.py); NULL: the default bundle (migration 0031).
    Column("ca_pem", Text),
    # False for an endpoint a tenant key added: its deliveries never reach a loopback or
    # private address, even where POSTRELAY_WEBHOOK_ALLOW_PRIVATE lets an operator's
    # endpoints reach them (migration 0033).
    Column("private_allowed", Boolean, nullable=False, server_default=text("false")),
    CheckConstraint("url ~ '^https?://'", name="webhook_endpoint_url_http_chk"),
    CheckConstraint("left(secret, 6) = 'whsec_'", name="webhook_endpoint_secret_chk"),
    CheckConstraint("disabled_by IN ('operator', 'tenant', 'receiver')",
                    name="webhook_endpoint_disabled_by_chk"),
    CheckConstraint("(disabled_by IS NULL) = enabled",
                    name="webhook_endpoint_disabled_by_enabled_chk"),
    Index("ix_webhook_endpoint_tenant", "tenant_id"),
)

webhook_attempt = Table(
    "aa_webhook_attempt",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("job_id", UUID(as_uuid=True)),
    Column("endpoint_id", UUID(as_uuid=True),
           ForeignKey("mdm.aa_webhook_endpoint.id", ondelete="CASCADE"), nullable=False),
    Column("event_id", UUID(as_uuid=True), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("status_code", Integer),  # NULL: no HTTP response (refused, network error, timeout)
    Column("duration_ms", Integer, nullable=False),
    Column("response_body", Text),  # the first 2 KB
    Column("error", Text),
    Column("created_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Index("ix_webhook_attempt_endpoint_time", "endpoint_id", "created_at"),
    Index("ix_webhook_attempt_event", "event_id"),
)
