"""time-ordered ids for the tables that grow: jobs, outbox events, email log rows

postrelay makes these ids itself (core/ids.py) in the UUID version 7 layout, so that the
live rows' primary-key entries sit together at the right edge of the index instead of on
random pages all over it: with random ids, every claim and completion beside millions of
done jobs read a primary-key page from outside the buffer cache and wrote it whole into
the WAL after each checkpoint. The server default follows, for rows written by other
means (an INSERT by hand, a baseline). `mdm.uuid_v7()` is PostgreSQL 18's `uuidv7()` for
the versions before it: 48 bits of Unix milliseconds over gen_random_uuid()'s first six
bytes, and the version nibble turned from 4 into 7.

Existing rows keep their ids; nothing is rewritten, so the upgrade is instant on a
populated database.

Revision ID: 0011
Revises: 0009
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("aa_job", "aa_outbox_event", "aa_email_log")


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


def downgrade() -> None:
    for table in TABLES:
        op.execute(f"ALTER TABLE mdm.{table} ALTER COLUMN id SET DEFAULT gen_random_uuid()")
    op.execute("DROP FUNCTION mdm.uuid_v7()")
