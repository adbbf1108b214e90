"""audit rows for cron entries: who created and who deleted them

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # No foreign key to the entry: the audit row outlives a deleted entry.
    op.create_table(
        "aa_cron_audit",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("cron_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("tenant_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("detail", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("created_at", pg.TIMESTAMP(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        schema="mdm",
    )
    op.create_index("ix_cron_audit_name", "aa_cron_audit", ["name"], schema="mdm")


def downgrade() -> None:
    op.drop_table("aa_cron_audit", schema="mdm")
