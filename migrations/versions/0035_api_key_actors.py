"""keys: who made each API key and who revoked it

A tenant key opens one tenant's data, and `postrelay keys add` and `keys revoke` were the
only operator commands whose change named no actor: the key's row kept when it was made
and revoked, not by whom. `created_by` and `revoked_by` do (`cli:<user>@<host>`, or the
actor code passes). Keys made before this have nobody: NULL, shown as not recorded.

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0035"
down_revision: str | None = "0034"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("aa_api_key", sa.Column("created_by", sa.Text), schema="mdm")
    op.add_column("aa_api_key", sa.Column("revoked_by", sa.Text), schema="mdm")
    op.create_check_constraint(
        "api_key_revoked_by_chk",
        "aa_api_key",
        "revoked_by IS NULL OR revoked_at IS NOT NULL",
        schema="mdm",
    )


def downgrade() -> None:
    op.drop_column("aa_api_key", "revoked_by", schema="mdm")
    op.drop_column("aa_api_key", "created_by", schema="mdm")
