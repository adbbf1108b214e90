"""email sending marks: one narrow insert before DATA, one log row per attempt after it

Before, every attempt inserted its `sending` row into aa_email_log (nine indexes, two
foreign-key checks) and then updated it to the outcome: an update that could not be HOT,
so every index took a second entry. Now the durable record made before DATA is a row of
aa_email_sending (one index), deleted in the transaction that inserts the attempt's one
log row with its outcome. A mark that outlives its attempt is what a `sending` row was: the
next attempt (or the sweep, for a job that will not run again) logs it as `unknown`.

The log also loses what its writes paid for and no query needs:
* the foreign keys to aa_tenant and aa_job: each inserted row locked the tenant's row and
  the job's row (a WAL record and a dirtied page for the job, shared locks on one tenant
  row from every worker); the job's row is written by the same code, and the log is a
  record that outlives jobs (job_id was set NULL by job retention; it now keeps the id);
* ix_email_log_message_id: a Message-ID is `<job id@domain>`, so the job index finds it;
* ix_email_log_delivery_time becomes partial: only rows that feedback reached have one.

Upgrading a populated database moves every `sending` row to a mark (and back on downgrade).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = pg.TIMESTAMP(timezone=True)
UUID = pg.UUID(as_uuid=True)


def upgrade() -> None:
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
    # Every row is deleted within seconds of its insert: vacuum after a fixed number of dead
    # rows, not a fraction of a table that is almost all dead rows between vacuums.
    op.execute("ALTER TABLE mdm.aa_email_sending SET (autovacuum_vacuum_scale_factor = 0,"
               " autovacuum_vacuum_threshold = 10000)")
    op.execute("""
        WITH moved AS (
            DELETE FROM mdm.aa_email_log l WHERE status = 'sending' AND job_id IS NOT NULL
            RETURNING l.*
        )
        INSERT INTO mdm.aa_email_sending (job_id, id, tenant_id, attempt, created_at, row)
        SELECT m.job_id, m.id, m.tenant_id, m.attempt, m.created_at, to_jsonb(m) - 'status'
        FROM moved m
    """)
    # Without a job there is no next attempt to find the mark: what it says is known now.
    op.execute("""
        UPDATE mdm.aa_email_log SET status = 'unknown', finished_at = now(),
            error = 'the worker sending this attempt was lost before it recorded the reply'
        WHERE status = 'sending'
    """)
    op.drop_constraint("aa_email_log_tenant_id_fkey", "aa_email_log", schema="mdm",
                       type_="foreignkey")
    op.drop_constraint("aa_email_log_job_id_fkey", "aa_email_log", schema="mdm",
                       type_="foreignkey")
    op.drop_index("ix_email_log_message_id", "aa_email_log", schema="mdm")
    op.drop_index("ix_email_log_delivery_time", "aa_email_log", schema="mdm")
    op.create_index("ix_email_log_delivery_time", "aa_email_log", ["delivery", "created_at"],
                    schema="mdm", postgresql_where=sa.text("delivery IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("ix_email_log_delivery_time", "aa_email_log", schema="mdm")
    op.create_index("ix_email_log_delivery_time", "aa_email_log", ["delivery", "created_at"],
                    schema="mdm")
    op.create_index("ix_email_log_message_id", "aa_email_log", ["message_id"], schema="mdm")
    # Rows whose job or tenant is gone cannot keep their references under the old keys.
    op.execute("""
        UPDATE mdm.aa_email_log l SET job_id = NULL
        WHERE job_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM mdm.aa_job j WHERE j.id = l.job_id)
    """)
    op.execute("""
        DELETE FROM mdm.aa_email_log l
        WHERE NOT EXISTS (SELECT 1 FROM mdm.aa_tenant t WHERE t.id = l.tenant_id)
    """)
    op.create_foreign_key("aa_email_log_job_id_fkey", "aa_email_log", "aa_job", ["job_id"],
                          ["id"], source_schema="mdm", referent_schema="mdm",
                          ondelete="SET NULL")
    op.create_foreign_key("aa_email_log_tenant_id_fkey", "aa_email_log", "aa_tenant",
                          ["tenant_id"], ["id"], source_schema="mdm", referent_schema="mdm",
                          ondelete="CASCADE")
    op.execute("""
        INSERT INTO mdm.aa_email_log
        SELECT (jsonb_populate_record(NULL::mdm.aa_email_log,
                                      s.row || '{"status": "sending"}')).*
        FROM mdm.aa_email_sending s
        ON CONFLICT (id) DO NOTHING
    """)
    op.drop_table("aa_email_sending", schema="mdm")
