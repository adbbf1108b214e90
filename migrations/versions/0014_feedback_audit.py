"""feedback operators: an audit row for every lifted suppression

`postrelay emails unsuppress` deletes an address's suppression rows; aa_email_suppression_audit
keeps what was lifted (category, reason, source), by whom and when, so a bounce or complaint
that was overridden can be traced. It grows with operator actions, not with traffic.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.TIMESTAMP(timezone=True)


def upgrade() -> None:
    op.create_table(
        "aa_email_suppression_audit",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("tenant_id", pg.UUID(as_uuid=True),
                  sa.ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE"), nullable=False),
        sa.Column("address", sa.Text, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("detail", pg.JSONB, nullable=False),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.CheckConstraint("action IN ('unsuppress')", name="email_suppression_audit_action_chk"),
        schema="mdm",
    )
    op.create_index("ix_email_suppression_audit_address", "aa_email_suppression_audit",
                    ["tenant_id", "address", "created_at"], schema="mdm")


def downgrade() -> None:
    op.drop_table("aa_email_suppression_audit", schema="mdm")
