"""The queue's tables as SQLAlchemy metadata. The Alembic migrations create them; a test
checks that the two agree."""

import uuid

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, ENUM, JSONB, UUID

from postrelay.core.db import SCHEMA, TIMESTAMPTZ, metadata

# The seed's kinds. The database enum is the source of truth: `postrelay kinds add NAME`
# writes a migration that extends it.
BUILTIN_KINDS = (
    "email_send",
    "bulk_import",
    "reindex",
    "outbox_dispatch",
    "cleanup_jobs",
    "virus_scan",
    "index_sync",
    "gin_backfill",
)
STATUSES = ("pending", "running", "done", "failed", "dlq")

job_kind = ENUM(*BUILTIN_KINDS, name="job_kind", schema=SCHEMA, create_type=False)
job_status = ENUM(*STATUSES, name="job_status", schema=SCHEMA, create_type=False)


# The reserved tenant that owns installation-wide jobs such as retention cleanup.
SYSTEM_TENANT_ID = uuid.UUID(int=0)

tenant = Table(
    "aa_tenant",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()")),
    Column("name", Text, nullable=False, unique=True),
    Column("created_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
)

job = Table(
    "aa_job",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True,
           server_default=text("mdm.uuid_v7()")),  # time-ordered: core/ids.py
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("mdm.aa_tenant.id"), nullable=False),
    Column("job_kind", job_kind, nullable=False),
    Column("status", job_status, nullable=False, server_default=text("'pending'")),
    Column("payload", JSONB, nullable=False),
    Column("priority", SmallInteger, nullable=False, server_default=text("100")),
    Column("available_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False, server_default=text("8")),
    Column("last_error", Text),
    Column("claimed_by", Text),
    Column("claimed_at", TIMESTAMPTZ),
    Column("completed_at", TIMESTAMPTZ),
    Column("idempotency_key", Text),
    Column("created_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Column("created_by", Text),
    CheckConstraint("jsonb_typeof(payload) = 'object'", name="job_payload_is_object_chk"),
    CheckConstraint("attempts >= 0 AND max_attempts >= 1", name="job_attempts_nonneg_chk"),
    Index(
        "job_idempotency_uk",
        "tenant_id",
        "job_kind",
        "idempotency_key",
        unique=True,
        # The outbox relay's keys are kept unique by its delivery links (migration 0021).
        postgresql_where=text("idempotency_key IS NOT NULL "
                              "AND idempotency_key NOT LIKE 'outbox:%'"),
    ),
    Index(
        "ix_job_dispatch",
        "status",
        "priority",
        "available_at",
        postgresql_where=text("status = 'pending'"),
    ),
    Index("ix_job_claimed_stale", "claimed_at", postgresql_where=text("status = 'running'")),
    Index("ix_job_tenant_kind", "tenant_id", "job_kind", "status"),
    # Fair claiming (migration 0015): the tenants with due work at one priority level, and
    # each one's oldest jobs, without walking another tenant's backlog.
    Index("ix_job_fair", "priority", "tenant_id", "available_at",
          postgresql_where=text("status = 'pending'")),
    Index("ix_job_done_completed", "completed_at", postgresql_where=text("status = 'done'")),
    # Failed and dead jobs by time: the dashboard's failures per minute and its DLQ list.
    Index("ix_job_failed_completed", "completed_at",
          postgresql_where=text("status IN ('failed', 'dlq')")),
)

# What happened to a job outside the normal flow: dead-lettered, rescued, replayed, discarded.
# No foreign key to aa_job: the audit row outlives a discarded or cleaned-up job.
job_audit = Table(
    "aa_job_audit",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("job_id", UUID(as_uuid=True), nullable=False),
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("job_kind", job_kind, nullable=False),
    Column("action", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("detail", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("created_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Index("ix_job_audit_job", "job_id"),
    Index("ix_job_audit_time", "created_at"),  # retention (POSTRELAY_AUDIT_RETENTION_DAYS)
)

# Done jobs per minute and tenant, for minutes that have closed (queue/maintenance/rollup.py):
# the overview's last hour sums these instead of counting every done job of the hour.
job_done_minute = Table(
    "aa_job_done_minute",
    metadata,
    Column("minute", TIMESTAMPTZ, primary_key=True),
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE"),
           primary_key=True),
    Column("done", BigInteger, nullable=False),
)

# The rollup's mark, one row: every minute before `until` is in aa_job_done_minute, and a
# round locks the row, so two leaders never tally the same minutes at once.
job_done_rollup = Table(
    "aa_job_done_rollup",
    metadata,
    Column("id", Boolean, primary_key=True, server_default=text("true")),
    Column("until", TIMESTAMPTZ),
    CheckConstraint("id", name="job_done_rollup_one_row_chk"),
)

# Live workers and their heartbeats: the rescuer leaves a job alone while its worker beats.
worker = Table(
    "aa_worker",
    metadata,
    Column("id", Text, primary_key=True),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("tenants", ARRAY(UUID(as_uuid=True))),
    Column("kinds", ARRAY(Text)),
    Column("concurrency", Integer, nullable=False),
    Column("started_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Column("heartbeat_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
)

# A cancelled running job's note to the worker that runs it (migration 0013): the job is
# already `failed`; the worker finds the row within a second, cancels the handler's task
# and deletes the row. Kept out of aa_job, whose columns are the seed's.
job_cancel = Table(
    "aa_job_cancel",
    metadata,
    Column("job_id", UUID(as_uuid=True), primary_key=True),
    Column("claimed_by", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("requested_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Index("ix_job_cancel_worker", "claimed_by"),
)

# Pauses (migration 0015): workers claim no job that a row matches. NULL tenant or kind
# means every one, so the row with both NULL pauses everything; one row per scope.
job_pause = Table(
    "aa_job_pause",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE")),
    Column("job_kind", job_kind),
    Column("paused_by", Text, nullable=False),
    Column("paused_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    UniqueConstraint("tenant_id", "job_kind", name="job_pause_scope_uk",
                     postgresql_nulls_not_distinct=True),
)

# Rate and concurrency limits (migration 0015), enforced in the claim (sql/limited.sql,
# job_claim_limited): per
# kind, optionally within a tenant (the tenant's own limit governs its jobs), optionally per
# value of a payload field (key_path, a path into the payload). One row per scope.
job_limit = Table(
    "aa_job_limit",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("job_kind", job_kind, nullable=False),
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE")),
    Column("key_path", ARRAY(Text)),
    Column("rate_per_sec", Float),
    Column("burst", Integer),
    Column("concurrency", Integer),
    Column("created_by", Text, nullable=False),
    Column("created_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    UniqueConstraint("job_kind", "tenant_id", name="job_limit_scope_uk",
                     postgresql_nulls_not_distinct=True),
    CheckConstraint("rate_per_sec IS NOT NULL OR concurrency IS NOT NULL",
                    name="job_limit_something_chk"),
    # 1e-100: core/rates.py's MIN_RATE_PER_SEC (migration 0036 says why).
    CheckConstraint("rate_per_sec IS NULL OR (rate_per_sec >= 1e-100 AND burst >= 1)",
                    name="job_limit_rate_chk"),
    CheckConstraint("concurrency IS NULL OR concurrency >= 1", name="job_limit_concurrency_chk"),
)

# A rate limit's token bucket per key ('' without a key_path): the tokens left at
# refilled_at; the claim refills them by the rate for the time since.
job_limit_bucket = Table(
    "aa_job_limit_bucket",
    metadata,
    Column("limit_id", BigInteger, ForeignKey("mdm.aa_job_limit.id", ondelete="CASCADE"),
           primary_key=True),
    Column("key", Text, primary_key=True),
    Column("tokens", Float, nullable=False),
    Column("refilled_at", TIMESTAMPTZ, nullable=False),
)

# Throttled destinations (migration 0019): a kind (key_path NULL, key '') or one value of
# a payload field that refused work (SMTP 421/454, HTTP 429/503). The limited claim takes
# none of its jobs before paused_until, then rate_per_sec doubled every step_secs, capped
# at ceiling_per_sec (the configured rate; NULL: none), from its own token bucket; the row
# counts until ends_at, then maintenance deletes it (queue/throttles.py).
job_throttle = Table(
    "aa_job_throttle",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("job_kind", job_kind, nullable=False),
    Column("key_path", ARRAY(Text)),
    Column("key", Text, nullable=False, server_default=text("''")),
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE")),
    Column("rate_per_sec", Float, nullable=False),
    Column("ceiling_per_sec", Float),
    Column("step_secs", Float, nullable=False),
    Column("paused_until", TIMESTAMPTZ, nullable=False),
    Column("ends_at", TIMESTAMPTZ, nullable=False),
    Column("tokens", Float, nullable=False),
    Column("refilled_at", TIMESTAMPTZ, nullable=False),
    Column("refusals", Integer, nullable=False, server_default=text("1")),
    Column("reason", Text, nullable=False),
    Column("started_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Column("changed_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    UniqueConstraint("job_kind", "key_path", "key", name="job_throttle_scope_uk",
                     postgresql_nulls_not_distinct=True),
    CheckConstraint("rate_per_sec > 0 AND step_secs > 0", name="job_throttle_rate_chk"),
)

# Who paused and resumed what (and, later, set limits): scopes that need not name a job,
# which aa_job_audit's rows must.
flow_audit = Table(
    "aa_flow_audit",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("action", Text, nullable=False),
    Column("tenant_id", UUID(as_uuid=True)),
    Column("job_kind", job_kind),
    Column("actor", Text, nullable=False),
    Column("detail", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("created_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Index("ix_flow_audit_time", "created_at"),
)

# Named leases: which process runs maintenance right now.
lease = Table(
    "aa_lease",
    metadata,
    Column("name", Text, primary_key=True),
    Column("holder", Text, nullable=False),
    Column("expires_at", TIMESTAMPTZ, nullable=False),
)

# Cron entries: each firing enqueues one job. Schedules are stored with 6 fields
# (seconds first); times are UTC.
cron_entry = Table(
    "aa_cron_entry",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()")),
    Column("name", Text, nullable=False),
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("mdm.aa_tenant.id"), nullable=False),
    Column("schedule", Text, nullable=False),
    Column("job_kind", job_kind, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("priority", SmallInteger, nullable=False, server_default=text("100")),
    Column("max_attempts", Integer),
    Column("last_run", TIMESTAMPTZ),
    Column("next_run", TIMESTAMPTZ),
    Column("created_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Column("created_by", Text),
    # Its firings fail (migration 0030): since the first of them, and the latest reason;
    # cleared by the next firing that succeeds (queue/maintenance/scheduler.py).
    Column("failing_since", TIMESTAMPTZ),
    Column("last_error", Text),
    # When the latest line about those failures was logged, by whichever worker (migration
    # 0032): the scheduler's claim of the next line, so N workers say it once.
    Column("failure_logged_at", TIMESTAMPTZ),
    CheckConstraint("jsonb_typeof(payload) = 'object'", name="cron_payload_is_object_chk"),
    CheckConstraint("max_attempts IS NULL OR max_attempts >= 1", name="cron_max_attempts_chk"),
    # Names are per tenant (migration 0010); `postrelay.*` are the system's (queue/reserved.py).
    UniqueConstraint("tenant_id", "name", name="cron_tenant_name_uk"),
)

# Who created and who deleted a cron entry (the entry itself may be gone).
cron_audit = Table(
    "aa_cron_audit",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("cron_id", UUID(as_uuid=True), nullable=False),
    Column("name", Text, nullable=False),
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("action", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("detail", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("created_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Index("ix_cron_audit_name", "name"),
    Index("ix_cron_audit_time", "created_at"),  # retention
)
