"""flow control: pauses, rate and concurrency limits, their audit, and the index fair
claiming walks

A pause stops workers from claiming matching jobs: every job (tenant and kind both NULL),
one kind, one tenant, or one kind within one tenant; one row per scope (NULLS NOT
DISTINCT). The claim reads it (queue/sql/job.sql, job_claim); aa_job keeps its columns.
Pausing and resuming leave rows in aa_flow_audit, which has room for scopes without a job.
A limit caps the jobs of a kind (optionally within a tenant, optionally per value of a
payload field) that are claimed per second (a token bucket with a burst) and that run at
once; the buckets' state lives in aa_job_limit_bucket, one row per limit and key.
ix_job_fair serves fair claiming: the tenants with due work at one priority level, each
one's oldest jobs first.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0015"
down_revision: str | None = "0014"
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
    op.create_table(
        "aa_job_limit",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("job_kind", JOB_KIND, nullable=False),
        sa.Column("tenant_id", pg.UUID(as_uuid=True),
                  sa.ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE")),
        sa.Column("key_path", pg.ARRAY(sa.Text)),
        sa.Column("rate_per_sec", sa.Float),
        sa.Column("burst", sa.Integer),
        sa.Column("concurrency", sa.Integer),
        sa.Column("created_by", sa.Text, nullable=False),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.UniqueConstraint("job_kind", "tenant_id", name="job_limit_scope_uk",
                            postgresql_nulls_not_distinct=True),
        sa.CheckConstraint("rate_per_sec IS NOT NULL OR concurrency IS NOT NULL",
                           name="job_limit_something_chk"),
        sa.CheckConstraint("rate_per_sec IS NULL OR (rate_per_sec > 0 AND burst >= 1)",
                           name="job_limit_rate_chk"),
        sa.CheckConstraint("concurrency IS NULL OR concurrency >= 1",
                           name="job_limit_concurrency_chk"),
        schema="mdm",
    )
    op.create_table(
        "aa_job_limit_bucket",
        sa.Column("limit_id", sa.BigInteger,
                  sa.ForeignKey("mdm.aa_job_limit.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("tokens", sa.Float, nullable=False),
        sa.Column("refilled_at", TZ, nullable=False),
        schema="mdm",
    )
    op.create_index("ix_flow_audit_time", "aa_flow_audit", ["created_at"], schema="mdm")
    op.create_index("ix_job_fair", "aa_job", ["priority", "tenant_id", "available_at"],
                    schema="mdm", postgresql_where=sa.text("status = 'pending'"))


def downgrade() -> None:
    op.drop_index("ix_job_fair", "aa_job", schema="mdm")
    op.drop_index("ix_flow_audit_time", "aa_flow_audit", schema="mdm")
    op.drop_table("aa_flow_audit", schema="mdm")
    op.drop_table("aa_job_limit_bucket", schema="mdm")
    op.drop_table("aa_job_limit", schema="mdm")
    op.drop_table("aa_job_pause", schema="mdm")
