"""cron: when an entry's failure was last logged, for every worker to read

Every worker runs the cron scheduler, and a failed firing rolls its claim of the slot
back, so every worker fires the slot again each round and fails. Each logged the failure
from what it had seen itself: with N workers, N lines when it started, N a minute while it
went on, N when it recovered. `failure_logged_at` is the time of the entry's latest line:
a worker logs only when its update of it succeeds (the scheduler's `cron_entry_failing`),
so one line is said once, whichever worker says it. Cleared with `failing_since` by the
next firing that succeeds.

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("aa_cron_entry",
                  sa.Column("failure_logged_at", sa.TIMESTAMP(timezone=True)), schema="mdm")


def downgrade() -> None:
    op.drop_column("aa_cron_entry", "failure_logged_at", schema="mdm")
