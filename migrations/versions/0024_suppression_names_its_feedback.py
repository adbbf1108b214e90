"""feedback: which report suppressed an address is read from the suppression row

Recording a bounce or complaint that suppressed its address also updated the feedback row
just inserted (`suppressed = true`): an update that could not be HOT (the row's page was
full), so it wrote a second version of the row and an entry in each of its six indexes,
about a third of the WAL of recording a hard bounce. The suppression row already names the
report that made it (feedback_id). Readers now take a report as having suppressed while its
suppression row names it, or once its `suppressed` flag is set, which lifting the
suppression now does, so the history outlives the lift. The index lets those readers find
the suppression of each report they show.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_email_suppression_feedback", "aa_email_suppression", ["feedback_id"],
                    schema="mdm", postgresql_where=sa.text("feedback_id IS NOT NULL"))


def downgrade() -> None:
    # The earlier readers look at the flag alone: set it where a suppression says so.
    op.execute("""
        UPDATE mdm.aa_email_feedback f SET suppressed = true
        FROM mdm.aa_email_suppression s
        WHERE s.feedback_id = f.id AND NOT f.suppressed
    """)
    op.drop_index("ix_email_suppression_feedback", "aa_email_suppression", schema="mdm")
