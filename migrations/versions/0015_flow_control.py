"""flow control: pauses, their audit, and the index fair claiming walks

A pause stops workers from claiming matching jobs: every job (tenant and kind both NULL),
one kind, one tenant, or one kind within one tenant; one row per scope (NULLS NOT
DISTINCT). The claim reads it (queue/sql/job.sql, job_claim); aa_job keeps its columns.
Pausing and resuming leave rows in aa_flow_audit, which has room for scopes without a job.
ix_job_fair serves fair claiming: the tenants with due work at one priority level, each
one's oldest jobs first.

Revision ID: 0015
Revises: 0013
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0015"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.TIMESTAMP(timezone=True)
JOB_KIND = pg.ENUM(name="job_kind", schema="mdm", create_type=False)


def upgrade() -> None:
    op.create_table(
        "aa_job_pause",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("tenant_id", pg.UUID(as_uuid=True),
                  sa.ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE")),
        sa.Column("job_kind", JOB_KIND),
        sa.Column("paused_by", sa.Text, nullable=False),
        sa.Column("paused_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.UniqueConstraint("tenant_id", "job_kind", name="job_pause_scope_uk",
                            postgresql_nulls_not_distinct=True),
        schema="mdm",
    )
    op.create_table(
        "aa_flow_audit",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("tenant_id", pg.UUID(as_uuid=True)),
        sa.Column("job_kind", JOB_KIND),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("detail", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        schema="mdm",
    )
    op.create_index("ix_flow_audit_time", "aa_flow_audit", ["created_at"], schema="mdm")
    op.create_index("ix_job_fair", "aa_job", ["priority", "tenant_id", "available_at"],
                    schema="mdm", postgresql_where=sa.text("status = 'pending'"))


def downgrade() -> None:
    op.drop_index("ix_job_fair", "aa_job", schema="mdm")
    op.drop_index("ix_flow_audit_time", "aa_flow_audit", schema="mdm")
    op.drop_table("aa_flow_audit", schema="mdm")
    op.drop_table("aa_job_pause", schema="mdm")
