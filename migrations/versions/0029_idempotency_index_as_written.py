"""jobs: an idempotency index built from `migrate --sql` output is rebuilt as written

`postrelay migrate --sql` printed every `%` of the migrations doubled, and psql ran them as
printed: on a database built that way, job_idempotency_uk's predicate reads
`NOT LIKE 'outbox:%%'`, which is not the predicate enqueue's ON CONFLICT names, so every
enqueue failed ("there is no unique or exclusion constraint matching the ON CONFLICT
specification"). The script is printed as written now; this rebuilds the index where it is
the doubled one, and leaves every other database as it is. The new index is built beside
the old one before the old one goes, as 0021 did.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-07
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # chr(37) is `%`: the check looks for two of them, which written out would themselves
    # depend on how `%` is printed.
    op.execute("""
        DO $$
        BEGIN
            IF EXISTS (SELECT FROM pg_indexes
                       WHERE schemaname = 'mdm' AND indexname = 'job_idempotency_uk'
                         AND position(repeat(chr(37), 2) IN indexdef) > 0) THEN
                CREATE UNIQUE INDEX job_idempotency_uk_next
                    ON mdm.aa_job (tenant_id, job_kind, idempotency_key)
                    WHERE idempotency_key IS NOT NULL
                      AND idempotency_key NOT LIKE 'outbox:%';
                DROP INDEX mdm.job_idempotency_uk;
                ALTER INDEX mdm.job_idempotency_uk_next RENAME TO job_idempotency_uk;
            END IF;
        END
        $$
    """)


def downgrade() -> None:
    pass  # the index rebuilt is the one every other database has
