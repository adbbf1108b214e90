"""aa_outbox_delivery.event_id without a foreign key: retention deletes the links itself

The foreign key's per-row check was a fifth of the relay's mark statement: 2.4 ms in each
batch of 500 (PostgreSQL's statement log, the relay benchmark's workload one batch at a
time). The relay writes a link only for an event it holds locked in the same transaction,
and retention deletes an event's links in the statement that deletes the event; whoever
deletes events by hand deletes their links too.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FK = "aa_outbox_delivery_event_id_fkey"


def upgrade() -> None:
    op.drop_constraint(FK, "aa_outbox_delivery", schema="mdm", type_="foreignkey")


def downgrade() -> None:
    # Links of events deleted by hand while the key was away would refuse the key.
    op.execute("DELETE FROM mdm.aa_outbox_delivery d WHERE NOT EXISTS "
               "(SELECT 1 FROM mdm.aa_outbox_event e WHERE e.id = d.event_id)")
    op.create_foreign_key(FK, "aa_outbox_delivery", "aa_outbox_event", ["event_id"], ["id"],
                          source_schema="mdm", referent_schema="mdm", ondelete="CASCADE")
