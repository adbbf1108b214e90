"""webhooks: whether an endpoint may be delivered to at a private address

POSTRELAY_WEBHOOK_ALLOW_PRIVATE lets deliveries reach loopback and private addresses, for an
operator's own receivers inside the network. It was read for every endpoint at delivery, so
once it was on, a tenant's endpoint (added over the API, where a tenant key may never name
such an address) could still reach one through a public host name that resolves to it.
`private_allowed` is false for an endpoint a tenant key adds: its deliveries never reach
such an address, whatever the setting. An operator's endpoints (the CLI, the service-role
key, code calling webhook_add) are true and follow the setting as before; so are those
added before this, which only operators could add.

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0033"
down_revision: str | None = "0032"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("aa_webhook_endpoint",
                  sa.Column("private_allowed", sa.Boolean, nullable=False,
                            server_default=sa.text("false")), schema="mdm")
    op.execute("UPDATE mdm.aa_webhook_endpoint SET private_allowed = true")


def downgrade() -> None:
    op.drop_column("aa_webhook_endpoint", "private_allowed", schema="mdm")
