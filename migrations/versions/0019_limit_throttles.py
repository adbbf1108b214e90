"""limit throttles: a destination that refused work (SMTP 421/454, HTTP 429/503) is slowed
down or paused for every worker, and recovers step by step

One row per throttled destination: a kind as a whole (key_path NULL, key ''; the SMTP
server of email_send) or one value of a payload field (a webhook endpoint of
outbox_dispatch). The limited claim (queue/sql/job.sql, job_claim_limited) claims none of
its jobs before paused_until, then at `rate_per_sec` doubled every `step_secs`, capped at
`ceiling_per_sec` (the configured limit's rate; NULL when none is configured), drawing
from the row's own token bucket (tokens, refilled_at); from ends_at on the row no longer
counts, and maintenance deletes it. tenant_id is whose destination it is (an endpoint's
tenant; NULL for the shared SMTP server): it scopes the listing, not the claim.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.TIMESTAMP(timezone=True)
JOB_KIND = pg.ENUM(name="job_kind", schema="mdm", create_type=False)


def upgrade() -> None:
    op.create_table(
        "aa_job_throttle",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("job_kind", JOB_KIND, nullable=False),
        sa.Column("key_path", pg.ARRAY(sa.Text)),
        sa.Column("key", sa.Text, nullable=False, server_default=sa.text("''")),
        sa.Column("tenant_id", pg.UUID(as_uuid=True),
                  sa.ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE")),
        sa.Column("rate_per_sec", sa.Float, nullable=False),
        sa.Column("ceiling_per_sec", sa.Float),
        sa.Column("step_secs", sa.Float, nullable=False),
        sa.Column("paused_until", TZ, nullable=False),
        sa.Column("ends_at", TZ, nullable=False),
        sa.Column("tokens", sa.Float, nullable=False),
        sa.Column("refilled_at", TZ, nullable=False),
        sa.Column("refusals", sa.Integer, nullable=False, server_default=sa.text("1")),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("started_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("changed_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.UniqueConstraint("job_kind", "key_path", "key", name="job_throttle_scope_uk",
                            postgresql_nulls_not_distinct=True),
        sa.CheckConstraint("rate_per_sec > 0 AND step_secs > 0", name="job_throttle_rate_chk"),
        schema="mdm",
    )


def downgrade() -> None:
    op.drop_table("aa_job_throttle", schema="mdm")
