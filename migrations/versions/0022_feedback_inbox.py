"""feedback inbox: `postrelay inbound` answers 250 once a message is stored, not recorded

The receiver writes each accepted message (its raw bytes and RCPT TO list) into
aa_feedback_inbox and answers once that commit is flushed; a processor in the same process
parses and records the rows in batches of up to 100 afterwards, and deletes them. The table
is a queue: rows live for milliseconds, so it has only its primary key (ids are time
ordered, the processor takes the oldest first). No tenant column: a raw message's tenant is
unknown until it is matched.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = pg.TIMESTAMP(timezone=True)


def upgrade() -> None:
    op.create_table(
        "aa_feedback_inbox",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True,
                  server_default=sa.text("mdm.uuid_v7()")),
        sa.Column("received_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("envelope_to", pg.ARRAY(sa.Text), nullable=False),
        sa.Column("raw", sa.LargeBinary, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("last_error", sa.Text),
        sa.Column("available_at", TZ, nullable=False, server_default=sa.text("now()")),
        schema="mdm",
    )


def downgrade() -> None:
    op.drop_table("aa_feedback_inbox", schema="mdm")
