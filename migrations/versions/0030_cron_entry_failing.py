"""cron: an entry whose firings fail says since when and why

A cron entry whose firing fails (a payload over a limit lowered since, a schedule that
never comes) fails again every round, its slot still due. The scheduler logs it when it
starts, when the reason changes, once a minute while it goes on and when it recovers, and
records it on the entry: `failing_since`, the first failure of the run of failures, and
`last_error`, the latest reason; both are cleared by the next firing that succeeds.
`postrelay cron list`, the API and the dashboard show them.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-08
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.TIMESTAMP(timezone=True)


def upgrade() -> None:
    op.add_column("aa_cron_entry", sa.Column("failing_since", TZ), schema="mdm")
    op.add_column("aa_cron_entry", sa.Column("last_error", sa.Text), schema="mdm")


def downgrade() -> None:
    op.drop_column("aa_cron_entry", "last_error", schema="mdm")
    op.drop_column("aa_cron_entry", "failing_since", schema="mdm")
