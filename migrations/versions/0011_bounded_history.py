"""bounded history: time-ordered ids for the tables that grow, retention of the email log
and of the audits

Ids. 
postrelay makes these ids itself (core/ids.py) in the UUID version 7 layout, so that the
live rows' primary-key entries sit together at the right edge of the index instead of on
random pages all over it: with random ids, every claim and completion beside millions of
done jobs read a primary-key page from outside the buffer cache and wrote it whole into
the WAL after each checkpoint. The server default follows, for rows written by other
means (an INSERT by hand, a baseline). `mdm.uuid_v7()` is PostgreSQL 18's `uuidv7()` for
the versions before it: 48 bits of Unix milliseconds over gen_random_uuid()'s first six
bytes, and the version nibble turned from 4 into 7.

Retention. Two built-in cron entries run `cleanup_jobs` hourly for the email log and for
the job and cron audits; each deletes nothing until the operator sets a window
(POSTRELAY_EMAIL_LOG_RETENTION_DAYS, POSTRELAY_AUDIT_RETENTION_DAYS). The audits get an
index on created_at for their batched deletes (a row per dead-lettered, rescued or replayed
job: nothing on the hot path writes them); the email log's deletes use
ix_email_log_tenant_time, so it gets none.

Autovacuum. aa_job and aa_outbox_event are vacuumed once 1 % of their rows are dead
rather than the server's 20 %, which beside a large history let a steady drain bloat
aa_job by hundreds of megabytes before the first autovacuum.

Existing rows keep their ids and nothing is rewritten; the indexes are built on the small
audit tables only, so the upgrade is quick on a populated database.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("aa_job", "aa_outbox_event", "aa_email_log")
# Tables whose rows are updated in place: every job three times, every event once. The
# server's default autovacuum_vacuum_scale_factor (0.2) waits for dead rows worth a fifth
# of the table: beside 10 million done jobs, 2.4 million dead versions after a 10-minute
# drain at 2,000 jobs/s and no autovacuum yet, the table 665 MB larger. 1 % (and 10,000)
# keeps the dead versions to a few minutes' worth whatever the history.
VACUUMED = ("aa_job", "aa_outbox_event")
# Hourly, at minutes the other retention entries (:00 jobs, :30 outbox, :45 webhook
# attempts) leave free.
CRON = (
    ("postrelay.email-log-retention", "0 15 * * * *", "email_log"),
    ("postrelay.audit-retention", "0 50 * * * *", "audit"),
)


def upgrade() -> None:
    op.execute("""
        CREATE FUNCTION mdm.uuid_v7() RETURNS uuid
        LANGUAGE sql VOLATILE PARALLEL SAFE
        AS $$
            SELECT encode(
                set_bit(set_bit(
                    overlay(uuid_send(gen_random_uuid())
                            PLACING substring(int8send(
                                floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
                                FROM 3)
                            FROM 1 FOR 6),
                    52, 1), 53, 1),
                'hex')::uuid
        $$
    """)
    for table in TABLES:
        op.execute(f"ALTER TABLE mdm.{table} ALTER COLUMN id SET DEFAULT mdm.uuid_v7()")
    for table in VACUUMED:
        op.execute(f"ALTER TABLE mdm.{table} SET (autovacuum_vacuum_scale_factor = 0.01,"
                   " autovacuum_vacuum_threshold = 10000, autovacuum_analyze_scale_factor = 0.02)")
    op.create_index("ix_job_audit_time", "aa_job_audit", ["created_at"], schema="mdm")
    op.create_index("ix_cron_audit_time", "aa_cron_audit", ["created_at"], schema="mdm")
    for name, schedule, target in CRON:
        op.execute(
            "INSERT INTO mdm.aa_cron_entry (name, tenant_id, schedule, job_kind, payload, "
            f"max_attempts, created_by) VALUES ('{name}', "
            f"'00000000-0000-0000-0000-000000000000', '{schedule}', 'cleanup_jobs', "
            f"'{{\"target\": \"{target}\"}}', 3, 'migration 0011') "
            "ON CONFLICT (tenant_id, name) DO NOTHING"
        )


def downgrade() -> None:
    for table in VACUUMED:
        op.execute(f"ALTER TABLE mdm.{table} RESET (autovacuum_vacuum_scale_factor,"
                   " autovacuum_vacuum_threshold, autovacuum_analyze_scale_factor)")
    for name, _, _ in CRON:
        op.execute(f"DELETE FROM mdm.aa_cron_entry WHERE name = '{name}'")
    op.drop_index("ix_cron_audit_time", "aa_cron_audit", schema="mdm")
    op.drop_index("ix_job_audit_time", "aa_job_audit", schema="mdm")
    for table in TABLES:
        op.execute(f"ALTER TABLE mdm.{table} ALTER COLUMN id SET DEFAULT gen_random_uuid()")
    op.execute("DROP FUNCTION mdm.uuid_v7()")
