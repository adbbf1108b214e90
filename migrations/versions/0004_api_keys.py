"""tenant-scoped API keys for the HTTP admin API

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

# Revision 0003 is the outbox; this one follows it.
revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = pg.TIMESTAMP(timezone=True)


def upgrade() -> None:
    op.create_table(
        "aa_api_key",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True,
                  server_default=sa.text("gen_random_uuid()")),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("tenant_id", pg.UUID(as_uuid=True),
                  sa.ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE"), nullable=False),
        # sha256 hex of the key; the key itself is never stored.
        sa.Column("key_hash", sa.Text, nullable=False),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("revoked_at", TZ),
        sa.UniqueConstraint("name", name="api_key_name_uk"),
        # Authentication looks keys up by hash; the unique index serves that lookup.
        sa.UniqueConstraint("key_hash", name="api_key_hash_uk"),
        schema="mdm",
    )


def downgrade() -> None:
    op.drop_table("aa_api_key", schema="mdm")
