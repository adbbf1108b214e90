"""webhooks: a tenant's endpoints and the log of every delivery attempt

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = pg.TIMESTAMP(timezone=True)


def upgrade() -> None:
    op.create_table(
        "aa_webhook_endpoint",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True,
                  server_default=sa.text("gen_random_uuid()")),
        sa.Column("tenant_id", pg.UUID(as_uuid=True),
                  sa.ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE"), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        # Standard Webhooks' `whsec_<base64 key>`; HMAC needs the key itself, so it is not
        # hashed. Shown once, when the endpoint is added.
        sa.Column("secret", sa.Text, nullable=False),
        sa.Column("event_types", pg.ARRAY(sa.Text)),  # glob patterns; NULL/empty: all
        sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.text("true")),
        sa.Column("disabled_reason", sa.Text),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("updated_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.CheckConstraint("url ~ '^https?://'", name="webhook_endpoint_url_http_chk"),
        sa.CheckConstraint("left(secret, 6) = 'whsec_'", name="webhook_endpoint_secret_chk"),
        schema="mdm",
    )
    op.create_index("ix_webhook_endpoint_tenant", "aa_webhook_endpoint", ["tenant_id"],
                    schema="mdm")
    # One row per HTTP attempt. job_id has no foreign key: retention deletes done jobs,
    # and the delivery log must outlive them.
    op.create_table(
        "aa_webhook_attempt",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("job_id", pg.UUID(as_uuid=True)),
        sa.Column("endpoint_id", pg.UUID(as_uuid=True),
                  sa.ForeignKey("mdm.aa_webhook_endpoint.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("event_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("status_code", sa.Integer),
        sa.Column("duration_ms", sa.Integer, nullable=False),
        sa.Column("response_body", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        schema="mdm",
    )
    op.create_index("ix_webhook_attempt_endpoint_time", "aa_webhook_attempt",
                    ["endpoint_id", "created_at"], schema="mdm")
    op.create_index("ix_webhook_attempt_event", "aa_webhook_attempt", ["event_id"],
                    schema="mdm")


    # The delivery log is kept 30 days (a cleanup_jobs target registered by the worker).
    op.execute(
        "INSERT INTO mdm.aa_cron_entry (name, tenant_id, schedule, job_kind, payload, "
        "max_attempts, created_by) VALUES ('postrelay.webhook-attempt-retention', "
        "'00000000-0000-0000-0000-000000000000', '0 45 * * * *', 'cleanup_jobs', "
        "'{\"target\": \"webhook_attempts\"}', 3, 'migration 0005')"
    )


def downgrade() -> None:
    op.execute("DELETE FROM mdm.aa_cron_entry WHERE name = 'postrelay.webhook-attempt-retention'")
    op.drop_table("aa_webhook_attempt", schema="mdm")
    op.drop_table("aa_webhook_endpoint", schema="mdm")
