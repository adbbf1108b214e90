"""webhooks: who disabled an endpoint

An operator (the CLI, the service-role key, code calling webhook_disable without a tenant)
disables a tenant's endpoint to stop a receiver that does harm; the tenant's own key could
enable it again at once, since nothing recorded who had disabled it. `disabled_by` does:
'operator', 'tenant' (a tenant key) or 'receiver' (the worker, on a 410 Gone); NULL exactly
while the endpoint is enabled. A tenant key enables only what it or the receiver disabled.

Endpoints disabled before this are read from the reason each kind of disable wrote:
'410 Gone at ...' is the worker's ('receiver'); 'disabled by api:key:...' a tenant key's
over the API ('tenant'), which could enable it before and still can; every other reason
(the CLI's 'disabled by an operator' or its own --reason, 'disabled by api:service-role',
code's own) is an operator's, and so is a reason nobody wrote: the safe side, as only an
operator can lift it.

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-09
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0034"
down_revision: str | None = "0033"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("aa_webhook_endpoint", sa.Column("disabled_by", sa.Text), schema="mdm")
    op.execute("""
        UPDATE mdm.aa_webhook_endpoint
        SET disabled_by = CASE
                WHEN disabled_reason LIKE '410 Gone at %' THEN 'receiver'
                WHEN disabled_reason LIKE 'disabled by api:key:%' THEN 'tenant'
                ELSE 'operator'
            END
        WHERE NOT enabled
    """)
    op.create_check_constraint(
        "webhook_endpoint_disabled_by_chk", "aa_webhook_endpoint",
        "disabled_by IN ('operator', 'tenant', 'receiver')", schema="mdm")
    op.create_check_constraint(
        "webhook_endpoint_disabled_by_enabled_chk", "aa_webhook_endpoint",
        "(disabled_by IS NULL) = enabled", schema="mdm")


def downgrade() -> None:
    op.drop_column("aa_webhook_endpoint", "disabled_by", schema="mdm")
