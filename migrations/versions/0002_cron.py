"""cron entries, and the built-in retention cleanup as one of them

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = pg.TIMESTAMP(timezone=True)
KIND = pg.ENUM(name="job_kind", schema="mdm", create_type=False)


def upgrade() -> None:
    op.create_table(
        "aa_cron_entry",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True,
                  server_default=sa.text("gen_random_uuid()")),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("tenant_id", pg.UUID(as_uuid=True), sa.ForeignKey("mdm.aa_tenant.id"),
                  nullable=False),
        sa.Column("schedule", sa.Text, nullable=False),
        sa.Column("job_kind", KIND, nullable=False),
        sa.Column("payload", pg.JSONB, nullable=False),
        sa.Column("priority", sa.SmallInteger, nullable=False, server_default=sa.text("100")),
        sa.Column("max_attempts", sa.Integer),
        sa.Column("last_run", TZ),
        sa.Column("next_run", TZ),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("created_by", sa.Text),
        sa.CheckConstraint("jsonb_typeof(payload) = 'object'", name="cron_payload_is_object_chk"),
        sa.CheckConstraint("max_attempts IS NULL OR max_attempts >= 1",
                           name="cron_max_attempts_chk"),
        # One name across the installation: delete-by-name is never ambiguous.
        sa.UniqueConstraint("name", name="cron_name_uk"),
        schema="mdm",
    )
    # Retention runs as an ordinary cron entry: hourly, owned by the system tenant. Its
    # empty payload means "the POSTRELAY_JOB_RETENTION_DAYS of the worker that runs it".
    op.execute(
        "INSERT INTO mdm.aa_cron_entry (name, tenant_id, schedule, job_kind, payload, "
        "max_attempts, created_by) VALUES ('postrelay.retention', "
        "'00000000-0000-0000-0000-000000000000', '0 0 * * * *', 'cleanup_jobs', '{}', 3, "
        "'migration 0002')"
    )


def downgrade() -> None:
    op.drop_table("aa_cron_entry", schema="mdm")
