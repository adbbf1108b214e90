"""The API keys table: tenant-scoped API keys. Migration 0003_api_keys creates it."""

from sqlalchemy import CheckConstraint, Column, ForeignKey, Table, Text, UniqueConstraint, text
from sqlalchemy.dialects.postgresql import UUID

from postrelay.core.db import TIMESTAMPTZ, metadata

# A key bound to one tenant. Only the sha256 of the key is stored: the key itself is shown
# once, when `postrelay keys add` makes it. Revoking keeps the row (who had access, when),
# and the row names who made and who revoked the key (migration 0035; NULL before it).
# Deleting the tenant deletes its keys: a key of a tenant that no longer exists is useless.
api_key = Table(
    "aa_api_key",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()")),
    Column("name", Text, nullable=False),
    Column(
        "tenant_id",
        UUID(as_uuid=True),
        ForeignKey("mdm.aa_tenant.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("key_hash", Text, nullable=False),
    Column("created_at", TIMESTAMPTZ, nullable=False, server_default=text("now()")),
    Column("revoked_at", TIMESTAMPTZ),
    Column("created_by", Text),
    Column("revoked_by", Text),
    CheckConstraint("revoked_by IS NULL OR revoked_at IS NOT NULL", name="api_key_revoked_by_chk"),
    UniqueConstraint("name", name="api_key_name_uk"),
    UniqueConstraint("key_hash", name="api_key_hash_uk"),
)
