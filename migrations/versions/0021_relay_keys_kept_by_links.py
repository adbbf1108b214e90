"""the outbox relay's job keys are kept unique by its delivery links, not by job_idempotency_uk

Every job the relay makes carries the key `outbox:<event>:<route>`, and its link in
aa_outbox_delivery, unique on (event, route), already says the same thing: the relay now
writes the link first and makes only the jobs whose link is new (relay/sql/outbox.sql).
Left in the unique index, each such key cost every write of its job -- the insert, the
claim and the completion, none of which can be a HOT update -- an index entry and a
uniqueness check. The index now holds the keys callers give (which may not start with
`outbox:`).

The new index is built beside the old one before the old one goes, so the keys are never
unguarded. Downgrading puts the relay's keys back into it.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    _replace("idempotency_key IS NOT NULL AND idempotency_key NOT LIKE 'outbox:%'")


def downgrade() -> None:
    _replace("idempotency_key IS NOT NULL")


def _replace(predicate: str) -> None:
    op.execute(f"""
        CREATE UNIQUE INDEX job_idempotency_uk_next
            ON mdm.aa_job (tenant_id, job_kind, idempotency_key) WHERE {predicate}
    """)
    op.execute("DROP INDEX mdm.job_idempotency_uk")
    op.execute("ALTER INDEX mdm.job_idempotency_uk_next RENAME TO job_idempotency_uk")
