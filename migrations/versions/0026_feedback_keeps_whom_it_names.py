"""feedback: whether a report names a message sent to its recipient is kept on its row

Soft bounces suppress an address once enough of them, each about a message postrelay sent
to that address, arrived within the window. The count checked each one against its log
row, so with POSTRELAY_EMAIL_LOG_RETENTION_DAYS shorter than the window, the bounces about
messages whose rows retention had deleted stopped counting, and the address was never
suppressed. The row now keeps what recording found (`sent_to`); the soft bounces on record
are given theirs from the log as it is now.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("aa_email_feedback", sa.Column("sent_to", sa.Boolean), schema="mdm")
    # Only soft bounces are counted: the other kinds' rows are left NULL.
    op.execute("""
        UPDATE mdm.aa_email_feedback f
        SET sent_to = EXISTS (SELECT 1 FROM mdm.aa_email_log l
                              WHERE l.id = f.email_log_id AND f.recipient = ANY(l.recipients))
        WHERE f.kind = 'soft-bounced'
    """)


def downgrade() -> None:
    op.drop_column("aa_email_feedback", "sent_to", schema="mdm")
