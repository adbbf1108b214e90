"""webhooks: an endpoint may trust a private certificate authority

An endpoint whose receiver presents a certificate from an internal CA could not be
delivered to over HTTPS: deliveries trusted the default bundle only. `ca_pem` holds that
CA's certificates (PEM text, checked when given), so a worker on any host verifies the
endpoint against it without a file; NULL keeps the default bundle.
`postrelay webhooks add --ca-file` and `webhooks set-ca` write it.

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-09
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("aa_webhook_endpoint", sa.Column("ca_pem", sa.Text), schema="mdm")


def downgrade() -> None:
    op.drop_column("aa_webhook_endpoint", "ca_pem", schema="mdm")
