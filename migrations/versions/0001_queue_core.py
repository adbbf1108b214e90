"""queue core: job kinds and statuses, tenants, jobs, audit, workers, leases

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = pg.TIMESTAMP(timezone=True)
KIND = pg.ENUM(name="job_kind", schema="mdm", create_type=False)
STATUS = pg.ENUM(name="job_status", schema="mdm", create_type=False)


def upgrade() -> None:
    op.execute(
        "CREATE TYPE mdm.job_kind AS ENUM ('email_send', 'bulk_import', 'reindex', "
        "'outbox_dispatch', 'cleanup_jobs', 'virus_scan', 'index_sync', 'gin_backfill')"
    )
    op.execute(
        "CREATE TYPE mdm.job_status AS ENUM ('pending', 'running', 'done', 'failed', 'dlq')"
    )
    op.create_table(
        "aa_tenant",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True,
                  server_default=sa.text("gen_random_uuid()")),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        schema="mdm",
    )
    # Installation-wide jobs (retention cleanup) belong to this reserved tenant.
    op.execute(
        "INSERT INTO mdm.aa_tenant (id, name) "
        "VALUES ('00000000-0000-0000-0000-000000000000', 'system')"
    )
    op.create_table(
        "aa_job",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True,
                  server_default=sa.text("gen_random_uuid()")),
        sa.Column("tenant_id", pg.UUID(as_uuid=True), sa.ForeignKey("mdm.aa_tenant.id"),
                  nullable=False),
        sa.Column("job_kind", KIND, nullable=False),
        sa.Column("status", STATUS, nullable=False, server_default=sa.text("'pending'")),
        sa.Column("payload", pg.JSONB, nullable=False),
        sa.Column("priority", sa.SmallInteger, nullable=False, server_default=sa.text("100")),
        sa.Column("available_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("max_attempts", sa.Integer, nullable=False, server_default=sa.text("8")),
        sa.Column("last_error", sa.Text),
        sa.Column("claimed_by", sa.Text),
        sa.Column("claimed_at", TZ),
        sa.Column("completed_at", TZ),
        sa.Column("idempotency_key", sa.Text),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("created_by", sa.Text),
        sa.CheckConstraint("jsonb_typeof(payload) = 'object'", name="job_payload_is_object_chk"),
        sa.CheckConstraint("attempts >= 0 AND max_attempts >= 1", name="job_attempts_nonneg_chk"),
        schema="mdm",
    )
    op.create_index(
        "job_idempotency_uk", "aa_job", ["tenant_id", "job_kind", "idempotency_key"],
        unique=True, schema="mdm", postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    # The hot-path index for the claim.
    op.create_index(
        "ix_job_dispatch", "aa_job", ["status", "priority", "available_at"],
        schema="mdm", postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "ix_job_claimed_stale", "aa_job", ["claimed_at"],
        schema="mdm", postgresql_where=sa.text("status = 'running'"),
    )
    op.create_index(
        "ix_job_tenant_kind", "aa_job", ["tenant_id", "job_kind", "status"], schema="mdm"
    )
    # Retention deletes old done jobs in batches; without this it would scan the table.
    op.create_index(
        "ix_job_done_completed", "aa_job", ["completed_at"],
        schema="mdm", postgresql_where=sa.text("status = 'done'"),
    )
    op.create_table(
        "aa_job_audit",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("job_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("tenant_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("job_kind", KIND, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("detail", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        schema="mdm",
    )
    op.create_index("ix_job_audit_job", "aa_job_audit", ["job_id"], schema="mdm")
    op.create_table(
        "aa_worker",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("tenants", pg.ARRAY(pg.UUID(as_uuid=True))),
        sa.Column("kinds", pg.ARRAY(sa.Text)),
        sa.Column("concurrency", sa.Integer, nullable=False),
        sa.Column("started_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("heartbeat_at", TZ, nullable=False, server_default=sa.text("now()")),
        schema="mdm",
    )
    op.create_table(
        "aa_lease",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("holder", sa.Text, nullable=False),
        sa.Column("expires_at", TZ, nullable=False),
        schema="mdm",
    )


def downgrade() -> None:
    op.drop_table("aa_lease", schema="mdm")
    op.drop_table("aa_worker", schema="mdm")
    op.drop_table("aa_job_audit", schema="mdm")
    op.drop_table("aa_job", schema="mdm")
    op.drop_table("aa_tenant", schema="mdm")
    op.execute("DROP TYPE mdm.job_status")
    op.execute("DROP TYPE mdm.job_kind")
