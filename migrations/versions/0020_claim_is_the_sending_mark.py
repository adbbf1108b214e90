"""the claim is the sending mark: no write before DATA beyond the job's claim

Every message committed a row of aa_email_sending before DATA (a flushed commit) and deleted
it with its outcome. The job's claim already commits before the handler runs and names the
attempt; a worker that dies leaves the claim to the rescuer, whose audit row now names the
lost claim's moment, from which the next attempt knows the id the lost attempt gave its log
row (orchestrator/attempts.py). So the marks go.

Upgrading logs every mark left behind `unknown`, as the next attempt would have, under the
attempt's own id; the table is dropped. Downgrading creates it again, empty.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = pg.TIMESTAMP(timezone=True)
UUID = pg.UUID(as_uuid=True)


def upgrade() -> None:
    op.execute("""
        INSERT INTO mdm.aa_email_log
        SELECT (jsonb_populate_record(NULL::mdm.aa_email_log, s.row || jsonb_build_object(
            'id', s.id, 'job_id', s.job_id, 'tenant_id', s.tenant_id,
            'attempt', s.attempt, 'created_at', s.created_at,
            'status', 'unknown', 'finished_at', now(),
            'error', 'the worker sending this attempt was lost before it recorded the reply'
        ))).*
        FROM mdm.aa_email_sending s
        ON CONFLICT (id) DO NOTHING
    """)
    op.drop_table("aa_email_sending", schema="mdm")


def downgrade() -> None:
    op.create_table(
        "aa_email_sending",
        sa.Column("job_id", UUID, nullable=False),
        sa.Column("id", UUID, nullable=False),
        sa.Column("tenant_id", UUID, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("row", pg.JSONB, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "id", name="aa_email_sending_pkey"),
        schema="mdm",
    )
    op.execute("ALTER TABLE mdm.aa_email_sending SET (autovacuum_vacuum_scale_factor = 0,"
               " autovacuum_vacuum_threshold = 10000)")
