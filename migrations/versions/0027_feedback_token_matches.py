"""feedback: a signed link's unsubscribe is matched by its token; unspecific bounces count

An unsubscribe through a signed link (one-click, or the `mailto:` token) names its tenant
and recipient, not a message: its row has no log row, and `postrelay feedback list
--unmatched` and `postrelay_email_feedback_unmatched_24h` counted every such click as
unmatched, beside forged reports. Such rows now say `matched_by = 'token'`; those on record
are given it (not those of a tenant deleted since, nor a report that claimed a row whose
recipient it was not).

Permanent failures whose code names no cause (5.0.0, 5.1.0, 5.3.0; and Exchange Online's
5.4.1) now count toward the soft-bounce limit, from `sent_to`, which 0026 filled for soft
bounces only: those on record are given theirs from the log as it is now.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("""
        UPDATE mdm.aa_email_feedback
        SET matched_by = 'token'
        WHERE kind = 'unsubscribe' AND source IN ('one-click', 'mail')
          AND matched_by IS NULL AND email_log_id IS NULL AND tenant_id IS NOT NULL
          AND NOT detail ? 'claimed_log_id'
    """)
    op.execute(r"""
        UPDATE mdm.aa_email_feedback f
        SET sent_to = EXISTS (SELECT 1 FROM mdm.aa_email_log l
                              WHERE l.id = f.email_log_id AND f.recipient = ANY(l.recipients))
        WHERE f.kind = 'bounced' AND f.sent_to IS NULL AND f.status ~ '^5\.([0-6]\.0|4\.1)$'
    """)


def downgrade() -> None:
    op.execute("UPDATE mdm.aa_email_feedback SET matched_by = NULL WHERE matched_by = 'token'")
