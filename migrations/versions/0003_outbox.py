"""transactional outbox: events and the jobs the relay made of them

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = pg.TIMESTAMP(timezone=True)


def upgrade() -> None:
    op.create_table(
        "aa_outbox_event",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True,
                  server_default=sa.text("gen_random_uuid()")),
        sa.Column("tenant_id", pg.UUID(as_uuid=True), sa.ForeignKey("mdm.aa_tenant.id"),
                  nullable=False),
        sa.Column("aggregate_type", sa.Text, nullable=False),
        sa.Column("aggregate_id", sa.Text, nullable=False),
        sa.Column("event_type", sa.Text, nullable=False),
        sa.Column("payload", pg.JSONB, nullable=False),
        sa.Column("headers", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("created_by", sa.Text),
        # Insertion order: events of one transaction share created_at, so order (per
        # aggregate, and the relay's oldest-first) is taken from this.
        sa.Column("seq", sa.BigInteger, sa.Identity(always=True), nullable=False),
        # Relay bookkeeping.
        sa.Column("handled_at", TZ),
        sa.Column("jobs_created", sa.Integer),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("available_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("last_error", sa.Text),
        sa.Column("dead_at", TZ),
        sa.CheckConstraint("jsonb_typeof(payload) = 'object'",
                           name="outbox_payload_is_object_chk"),
        sa.CheckConstraint("jsonb_typeof(headers) = 'object'",
                           name="outbox_headers_is_object_chk"),
        sa.CheckConstraint("event_type <> ''", name="outbox_event_type_not_empty_chk"),
        schema="mdm",
    )
    # The relay's hot path: unhandled, live events, oldest first.
    op.create_index(
        "ix_outbox_unhandled", "aa_outbox_event", ["seq"], schema="mdm",
        postgresql_where=sa.text("handled_at IS NULL AND dead_at IS NULL"),
    )
    op.create_index("ix_outbox_handled", "aa_outbox_event", ["handled_at"], schema="mdm",
                    postgresql_where=sa.text("handled_at IS NOT NULL"))
    op.create_index("ix_outbox_aggregate", "aa_outbox_event",
                    ["tenant_id", "aggregate_type", "aggregate_id", "seq"], schema="mdm")
    # Which job each (event, route) produced: follows an event to its jobs, and later to
    # their email-log rows and webhook attempts, with plain joins.
    op.create_table(
        "aa_outbox_delivery",
        sa.Column("event_id", pg.UUID(as_uuid=True),
                  sa.ForeignKey("mdm.aa_outbox_event.id", ondelete="CASCADE"), nullable=False),
        sa.Column("route", sa.Text, nullable=False),
        sa.Column("job_id", pg.UUID(as_uuid=True), nullable=False),
        # Ordered jobs of one aggregate run one after another (see relay/ordering.py).
        sa.Column("ordered", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.PrimaryKeyConstraint("event_id", "route", name="outbox_delivery_pk"),
        schema="mdm",
    )
    op.create_index("ix_outbox_delivery_job", "aa_outbox_delivery", ["job_id"], schema="mdm")
    op.create_index("ix_outbox_delivery_ordered", "aa_outbox_delivery", ["event_id"],
                    schema="mdm", postgresql_where=sa.text("ordered"))
    # Handled events are deleted after POSTRELAY_OUTBOX_RETENTION_DAYS by this entry's jobs.
    op.execute(
        "INSERT INTO mdm.aa_cron_entry (name, tenant_id, schedule, job_kind, payload, "
        "max_attempts, created_by) VALUES ('postrelay.outbox-retention', "
        "'00000000-0000-0000-0000-000000000000', '0 30 * * * *', 'cleanup_jobs', "
        "'{\"target\": \"outbox\"}', 3, 'migration 0003')"
    )


def downgrade() -> None:
    op.execute("DELETE FROM mdm.aa_cron_entry WHERE name = 'postrelay.outbox-retention'")
    op.drop_table("aa_outbox_delivery", schema="mdm")
    op.drop_table("aa_outbox_event", schema="mdm")
