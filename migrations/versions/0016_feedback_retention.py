"""feedback retention: a built-in hourly cron entry for delivery feedback

Feedback rows (aa_email_feedback) named email log rows that log retention deleted, and
were kept forever. `postrelay.email-feedback-retention` runs `cleanup_jobs` with target
`email_feedback` at minute 20 (the other retention entries use :00, :15, :30, :45 and :50);
it deletes by `received_at` through the existing ix_email_feedback_time, in batches, with the
window POSTRELAY_EMAIL_FEEDBACK_RETENTION_DAYS, else the email log's (unset: kept). No
table or index changes, so the upgrade is one INSERT whatever the database holds.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "postrelay.email-feedback-retention"


def upgrade() -> None:
    op.execute(
        "INSERT INTO mdm.aa_cron_entry (name, tenant_id, schedule, job_kind, payload, "
        f"max_attempts, created_by) VALUES ('{NAME}', "
        "'00000000-0000-0000-0000-000000000000', '0 20 * * * *', 'cleanup_jobs', "
        "'{\"target\": \"email_feedback\"}', 3, 'migration 0016') "
        "ON CONFLICT (tenant_id, name) DO NOTHING"
    )


def downgrade() -> None:
    op.execute(f"DELETE FROM mdm.aa_cron_entry WHERE name = '{NAME}'")
