"""email hour tally: answered messages per closed hour, for the bounce and complaint rates

The dashboard's overview and `/metrics` show each tenant's bounce and complaint rates over
24 hours and 7 days. Their denominator, the messages answered in the window, was counted
from the email log on every read: a week of log rows (at a million a week, a quarter of a
second a page). The maintenance leader now tallies each hour once it has closed into
aa_email_hour (per tenant and status), and moves a mark past it (aa_email_hour_rollup, one
row); readers sum the tallied hours and count only the rows since the mark live. Nothing is
added to the writing of a log row.

Two new, empty tables: the upgrade is quick on a populated database. The first rounds
tally the last week of the log, a few hours a round.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = pg.TIMESTAMP(timezone=True)


def upgrade() -> None:
    op.create_table(
        "aa_email_hour",
        sa.Column("hour", TZ, nullable=False),
        sa.Column("tenant_id", pg.UUID(as_uuid=True),
                  sa.ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE"), nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("messages", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("hour", "tenant_id", "status"),
        schema="mdm",
    )
    op.create_table(
        "aa_email_hour_rollup",
        sa.Column("id", sa.Boolean, server_default=sa.text("true"), nullable=False),
        sa.Column("until", TZ),
        sa.PrimaryKeyConstraint("id"),
        sa.CheckConstraint("id", name="email_hour_rollup_one_row_chk"),
        schema="mdm",
    )


def downgrade() -> None:
    op.drop_table("aa_email_hour_rollup", schema="mdm")
    op.drop_table("aa_email_hour", schema="mdm")
