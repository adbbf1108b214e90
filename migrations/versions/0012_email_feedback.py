"""email feedback: late bounces, complaints and unsubscribes, matched to the email log

A new table keeps every piece of feedback (unmatched kept too); the log row gains its
delivery outcome (what feedback said after the SMTP handoff); a suppression can be of one
category (an unsubscribe) and says which source put it there.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = pg.TIMESTAMP(timezone=True)
UUID = pg.UUID(as_uuid=True)
PKEY = "aa_email_suppression_pkey"
# The values as of this migration, written out, not taken from the code: a migration makes
# the same schema whatever the code around it has become.
FEEDBACK_KINDS = ("delivered", "delayed", "soft-bounced", "bounced", "complaint", "unsubscribe",
                  "auto-reply", "unparsed")
DELIVERY_OUTCOMES = ("delayed", "delivered", "soft-bounced", "bounced", "complained")


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN (" + ", ".join(f"'{v}'" for v in values) + ")"


def upgrade() -> None:
    op.create_table(
        "aa_email_feedback",
        sa.Column("id", UUID, primary_key=True, server_default=sa.text("gen_random_uuid()")),
        # NULL while unmatched: nothing tells which tenant the feedback is about.
        sa.Column("tenant_id", UUID, sa.ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE")),
        sa.Column("email_log_id", UUID),
        sa.Column("matched_by", sa.Text),
        sa.Column("recipient", sa.Text),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("status", sa.Text),
        sa.Column("diagnostic", sa.Text),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("source_event_id", sa.Text),
        sa.Column("dedupe_key", sa.Text, nullable=False),
        sa.Column("suppressed", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("detail", pg.JSONB),
        sa.Column("occurred_at", TZ),
        sa.Column("received_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.CheckConstraint(_in("kind", FEEDBACK_KINDS), name="email_feedback_kind_chk"),
        sa.UniqueConstraint("dedupe_key", name="email_feedback_dedupe_uk"),
        schema="mdm",
    )
    for name, columns in (
        ("ix_email_feedback_time", ["received_at"]),
        ("ix_email_feedback_tenant_time", ["tenant_id", "received_at"]),
        ("ix_email_feedback_log", ["email_log_id"]),
        ("ix_email_feedback_recipient", ["tenant_id", "recipient", "kind", "received_at"]),
    ):
        op.create_index(name, "aa_email_feedback", columns, schema="mdm")

    op.add_column("aa_email_log", sa.Column("delivery", sa.Text), schema="mdm")
    op.add_column("aa_email_log", sa.Column("delivery_at", TZ), schema="mdm")
    op.create_check_constraint("email_log_delivery_chk", "aa_email_log",
                               "delivery IS NULL OR " + _in("delivery", DELIVERY_OUTCOMES),
                               schema="mdm")
    op.create_index("ix_email_log_queue_id", "aa_email_log", ["queue_id"], schema="mdm")
    op.create_index("ix_email_log_delivery_time", "aa_email_log", ["delivery", "created_at"],
                    schema="mdm")

    # '' is every category: the rows that exist (bounces) keep meaning "no mail at all".
    op.add_column("aa_email_suppression",
                  sa.Column("category", sa.Text, nullable=False, server_default=sa.text("''")),
                  schema="mdm")
    op.add_column("aa_email_suppression", sa.Column("source", sa.Text), schema="mdm")
    op.add_column("aa_email_suppression", sa.Column("feedback_id", UUID), schema="mdm")
    op.drop_constraint(PKEY, "aa_email_suppression", schema="mdm", type_="primary")
    op.create_primary_key(PKEY, "aa_email_suppression", ["tenant_id", "address", "category"],
                          schema="mdm")


def downgrade() -> None:
    # A category's unsubscribes would collide with the address's other rows under the old
    # key: they go, the whole-address suppressions stay.
    op.execute("DELETE FROM mdm.aa_email_suppression WHERE category <> ''")
    op.drop_constraint(PKEY, "aa_email_suppression", schema="mdm", type_="primary")
    op.create_primary_key(PKEY, "aa_email_suppression", ["tenant_id", "address"], schema="mdm")
    for column in ("feedback_id", "source", "category"):
        op.drop_column("aa_email_suppression", column, schema="mdm")
    op.drop_index("ix_email_log_delivery_time", "aa_email_log", schema="mdm")
    op.drop_index("ix_email_log_queue_id", "aa_email_log", schema="mdm")
    op.drop_constraint("email_log_delivery_chk", "aa_email_log", schema="mdm", type_="check")
    op.drop_column("aa_email_log", "delivery_at", schema="mdm")
    op.drop_column("aa_email_log", "delivery", schema="mdm")
    op.drop_table("aa_email_feedback", schema="mdm")
