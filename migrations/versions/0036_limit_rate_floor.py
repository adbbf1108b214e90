"""limits: no stored rate below 1e-100 jobs a second

The limited claim refills a bucket by rate x seconds idle in float8, and PostgreSQL raises
on a product that underflows rather than round it to 0: one limit of 5e-324/s made every
limited claim fail, of every limited kind and every tenant. New limits below the floor are
refused (core/rates.py); a limit stored before that is raised to it here, with a
`limit_set` audit row by `postrelay.migrate` saying what it was, and the check constraint
keeps it so.

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-07
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0036"
down_revision: str | None = "0035"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MIN_RATE_PER_SEC = "1e-100"  # core/rates.py, as it was when this was written


def upgrade() -> None:
    op.execute(f"""
        WITH raised AS (
            UPDATE mdm.aa_job_limit l
            SET rate_per_sec = CAST('{MIN_RATE_PER_SEC}' AS float8)
            FROM mdm.aa_job_limit o
            WHERE o.id = l.id AND l.rate_per_sec < CAST('{MIN_RATE_PER_SEC}' AS float8)
            RETURNING l.*, o.rate_per_sec AS was
        )
        INSERT INTO mdm.aa_flow_audit (action, tenant_id, job_kind, actor, detail)
        SELECT 'limit_set', r.tenant_id, r.job_kind, 'postrelay.migrate',
               jsonb_build_object('key_path', r.key_path, 'rate_per_sec', r.rate_per_sec,
                                  'burst', r.burst, 'concurrency', r.concurrency,
                                  'was', jsonb_build_object('rate_per_sec', r.was),
                                  'why', 'a rate below {MIN_RATE_PER_SEC}/s failed the '
                                         'limited claim of every tenant')
        FROM raised r
    """)
    op.drop_constraint("job_limit_rate_chk", "aa_job_limit", schema="mdm")
    op.create_check_constraint(
        "job_limit_rate_chk", "aa_job_limit",
        f"rate_per_sec IS NULL OR (rate_per_sec >= {MIN_RATE_PER_SEC} AND burst >= 1)",
        schema="mdm")


def downgrade() -> None:
    op.drop_constraint("job_limit_rate_chk", "aa_job_limit", schema="mdm")
    op.create_check_constraint(
        "job_limit_rate_chk", "aa_job_limit",
        "rate_per_sec IS NULL OR (rate_per_sec > 0 AND burst >= 1)", schema="mdm")
