"""jobs: a due time no reader can load is brought back into reach

`enqueue(run_at=...)` took any aware datetime, and a handler's RetryAfter or Snooze any
delay: year 1 at +14:00 is a year before it in UTC, and a delay of 10**12 seconds lands past
year 9999. PostgreSQL stores both; Python cannot load them, so a claim that met such a job
failed with every job it had taken beside it, and every list of jobs that showed it failed.
Both are refused or bounded now (jobspec.run_at_in_reach, outcome.bounded_delay); a job on
record with such a time is given the nearest one it could have had: due now, or 10 years
ahead.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-07
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("""
        UPDATE mdm.aa_job
        SET available_at = CASE WHEN available_at < TIMESTAMPTZ '0001-01-01 00:00:00+00'
                                THEN now() ELSE now() + INTERVAL '10 years' END
        WHERE available_at < TIMESTAMPTZ '0001-01-01 00:00:00+00'
           OR available_at >= TIMESTAMPTZ '9999-01-01 00:00:00+00'
    """)


def downgrade() -> None:
    pass  # the times replaced were ones nothing could read
