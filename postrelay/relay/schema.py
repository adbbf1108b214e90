"""The outbox tables as SQLAlchemy metadata (created by migration 0003).

Column names map onto Debezium's Outbox Event Router (`table.field.event.id=id`,
`table.field.event.key=aggregate_id`, `route.by.field=aggregate_type`,
`table.field.event.type=event_type`, `table.field.event.payload=payload`), so the same table
can also be streamed by CDC.
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
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

from postrelay.core.db import TIMESTAMPTZ, metadata

outbox_event = Table(
    "aa_outbox_event",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("mdm.uuid_v7()")),
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("mdm.aa_tenant.id"), nullable=False),
    Column("aggregate_type", Text, nullable=False),
    Column("aggregate_id", Text, nullable=False),
    Column("event_type", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("created_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Column("created_by", Text),
    Column("seq", BigInteger, Identity(always=True), nullable=False),
    Column("handled_at", TIMESTAMPTZ),
    Column("jobs_created", Integer),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("available_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Column("last_error", Text),
    Column("dead_at", TIMESTAMPTZ),
    CheckConstraint("jsonb_typeof(payload) = 'object'", name="outbox_payload_is_object_chk"),
    CheckConstraint("jsonb_typeof(headers) = 'object'", name="outbox_headers_is_object_chk"),
    CheckConstraint("event_type <> ''", name="outbox_event_type_not_empty_chk"),
    Index("ix_outbox_unhandled", "seq",
          postgresql_where=text("handled_at IS NULL AND dead_at IS NULL")),
    Index("ix_outbox_handled", "handled_at", postgresql_where=text("handled_at IS NOT NULL")),
    Index("ix_outbox_dead", "dead_at", postgresql_where=text("dead_at IS NOT NULL")),
    Index("ix_outbox_aggregate", "tenant_id", "aggregate_type", "aggregate_id", "seq"),
)

outbox_delivery = Table(
    "aa_outbox_delivery",
    metadata,
    # No foreign key to the event: the relay links only events it holds locked, retention
    # deletes the links with their event, and the per-row check is work in every batch
    # that guards nothing (migration 0009).
    Column("event_id", UUID(as_uuid=True), nullable=False),
    Column("route", Text, nullable=False),
    Column("job_id", UUID(as_uuid=True), nullable=False),
    Column("ordered", Boolean, nullable=False, server_default=text("false")),
    Column("created_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("event_id", "route", name="outbox_delivery_pk"),
    Index("ix_outbox_delivery_job", "job_id"),
    Index("ix_outbox_delivery_ordered", "event_id", postgresql_where=text("ordered")),
)
