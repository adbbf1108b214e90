"""job cancellation: cancel requests for running jobs; `cancelled` in the email log

Cancelling a pending job fails it at once. Cancelling a running one fails it too, and leaves
a row in aa_job_cancel for the worker that runs it: the worker checks for such rows about
twice a second and cancels the handler's task (queue/worker.py). aa_job keeps its columns.
An `email_send` job cancelled before it ran leaves an email log row of status `cancelled`.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.TIMESTAMP(timezone=True)
OLD_STATUSES = ("sending", "sent", "partial", "deferred", "bounced", "failed", "suppressed",
                "unknown")
NEW_STATUSES = (*OLD_STATUSES, "cancelled")


def _status_check(statuses: tuple[str, ...]) -> str:
    return "status IN (" + ", ".join(f"'{s}'" for s in statuses) + ")"


def upgrade() -> None:
    op.create_table(
        "aa_job_cancel",
        sa.Column("job_id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("claimed_by", sa.Text, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("requested_at", TZ, nullable=False, server_default=sa.text("now()")),
        schema="mdm",
    )
    op.create_index("ix_job_cancel_worker", "aa_job_cancel", ["claimed_by"], schema="mdm")
    op.drop_constraint("email_log_status_chk", "aa_email_log", schema="mdm", type_="check")
    op.create_check_constraint("email_log_status_chk", "aa_email_log",
                               _status_check(NEW_STATUSES), schema="mdm")


def downgrade() -> None:
    # The old check knows no `cancelled`: such rows say what `failed` says, nothing was sent.
    op.execute("UPDATE mdm.aa_email_log SET status = 'failed' WHERE status = 'cancelled'")
    op.drop_constraint("email_log_status_chk", "aa_email_log", schema="mdm", type_="check")
    op.create_check_constraint("email_log_status_chk", "aa_email_log",
                               _status_check(OLD_STATUSES), schema="mdm")
    op.drop_index("ix_job_cancel_worker", "aa_job_cancel", schema="mdm")
    op.drop_table("aa_job_cancel", schema="mdm")
