"""email: the log of every message attempt and the per-tenant suppression list

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = pg.TIMESTAMP(timezone=True)
UUID = pg.UUID(as_uuid=True)
# The statuses as of this migration, written out: taken from the code, they grew with it
# (0013's `cancelled`), so a new database differed from one migrated step by step.
EMAIL_STATUSES = ("sending", "sent", "partial", "deferred", "bounced", "failed", "suppressed",
                  "unknown")


def upgrade() -> None:
    # job_id: ON DELETE SET NULL, so job retention leaves the log in place. event_id has no
    # foreign key: outbox retention deletes handled events long before the log goes.
    op.create_table(
        "aa_email_log",
        sa.Column("id", UUID, primary_key=True, server_default=sa.text("gen_random_uuid()")),
        sa.Column("tenant_id", UUID, sa.ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("job_id", UUID, sa.ForeignKey("mdm.aa_job.id", ondelete="SET NULL")),
        sa.Column("event_id", UUID),
        sa.Column("template", sa.Text, nullable=False),
        sa.Column("template_version", sa.Text),
        sa.Column("category", sa.Text),
        sa.Column("from_address", sa.Text, nullable=False),
        sa.Column("recipients", pg.ARRAY(sa.Text), nullable=False),
        sa.Column("to_addresses", pg.ARRAY(sa.Text), nullable=False),
        sa.Column("cc_addresses", pg.ARRAY(sa.Text)),
        sa.Column("bcc_addresses", pg.ARRAY(sa.Text)),
        sa.Column("subject", sa.Text),
        sa.Column("message_id", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("smtp_code", sa.Integer),
        sa.Column("smtp_enhanced", sa.Text),
        sa.Column("smtp_response", sa.Text),
        sa.Column("queue_id", sa.Text),
        sa.Column("recipient_results", pg.JSONB),
        sa.Column("error", sa.Text),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("finished_at", TZ),
        sa.CheckConstraint(
            "status IN (" + ", ".join(f"'{s}'" for s in EMAIL_STATUSES) + ")",
            name="email_log_status_chk",
        ),
        schema="mdm",
    )
    for name, columns, using in (
        ("ix_email_log_tenant_time", ["tenant_id", "created_at"], None),
        ("ix_email_log_recipients", ["recipients"], "gin"),
        ("ix_email_log_status_time", ["status", "created_at"], None),
        ("ix_email_log_job", ["job_id"], None),
        ("ix_email_log_event", ["event_id"], None),
        ("ix_email_log_message_id", ["message_id"], None),
    ):
        kwargs = {"postgresql_using": using} if using else {}
        op.create_index(name, "aa_email_log", columns, schema="mdm", **kwargs)

    op.create_table(
        "aa_email_suppression",
        sa.Column("tenant_id", UUID, sa.ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("address", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("smtp_code", sa.Integer),
        sa.Column("smtp_enhanced", sa.Text),
        sa.Column("email_log_id", UUID),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.PrimaryKeyConstraint("tenant_id", "address", name="aa_email_suppression_pkey"),
        schema="mdm",
    )


def downgrade() -> None:
    op.drop_table("aa_email_suppression", schema="mdm")
    op.drop_table("aa_email_log", schema="mdm")
