"""feedback inbox: a message of up to about 8 kB stays in its row, uncompressed

A bounce is a few kB, over the 2 kB at which PostgreSQL compresses a row's values (pglz) or
moves them out of line. The inbox keeps a message for milliseconds, so compressing it on the
way in and inflating it on the way out only costs the server CPU. With toast_tuple_target
at the most a page allows, rows up to about 8 kB are stored as they come; a larger message
is compressed and moved out of line as before.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROW_TARGET = 8160  # bytes: the largest toast_tuple_target an 8 kB page allows


def upgrade() -> None:
    op.execute(f"ALTER TABLE mdm.aa_feedback_inbox SET (toast_tuple_target = {ROW_TARGET})")


def downgrade() -> None:
    op.execute("ALTER TABLE mdm.aa_feedback_inbox RESET (toast_tuple_target)")
