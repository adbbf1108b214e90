"""done rollup: done jobs per closed minute for the overview; the last audits get retention

The dashboard's overview showed the last hour of done jobs by counting them, through
ix_job_done_completed, on every refresh: during a drain at 2,000 jobs/s that is millions of
index entries a refresh (a median of 509 ms). The maintenance leader now tallies each
minute once, after it has closed, into aa_job_done_minute (per tenant), and the page sums
those rows and counts only the minutes since the tally's mark (aa_job_done_rollup, one
row) live. Nothing is added to the completion of a job.

Retention: aa_flow_audit (pauses and limits) and aa_email_suppression_audit (lifted
suppressions) join the job and cron audits under POSTRELAY_AUDIT_RETENTION_DAYS and the
existing `postrelay.audit-retention` entry; the suppression audit gets an index on
created_at for its batched deletes (the flow audit has one).

Two new, empty tables and an index on a table that grows with operator actions: the
upgrade is quick on a populated database.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = pg.TIMESTAMP(timezone=True)


def upgrade() -> None:
    op.create_table(
        "aa_job_done_minute",
        sa.Column("minute", TZ, nullable=False),
        sa.Column("tenant_id", pg.UUID(as_uuid=True),
                  sa.ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE"), nullable=False),
        sa.Column("done", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("minute", "tenant_id"),
        schema="mdm",
    )
    op.create_table(
        "aa_job_done_rollup",
        sa.Column("id", sa.Boolean, server_default=sa.text("true"), nullable=False),
        sa.Column("until", TZ),
        sa.PrimaryKeyConstraint("id"),
        sa.CheckConstraint("id", name="job_done_rollup_one_row_chk"),
        schema="mdm",
    )
    op.create_index("ix_email_suppression_audit_time", "aa_email_suppression_audit",
                    ["created_at"], schema="mdm")


def downgrade() -> None:
    op.drop_index("ix_email_suppression_audit_time", "aa_email_suppression_audit",
                  schema="mdm")
    op.drop_table("aa_job_done_rollup", schema="mdm")
    op.drop_table("aa_job_done_minute", schema="mdm")
