"""cron names unique per tenant; entries that break the reserved rules are removed

A name unique across the installation told a tenant whether another tenant had an entry of
that name (409 against 201) and let it squat names, the built-in `postrelay.*` ones included.
Names are now unique per (tenant, name). Entries that the rules of postrelay/queue/reserved.py
refuse from now on are deleted, each with a `cron_delete` audit row that keeps the whole
entry: a system kind (`cleanup_jobs`) outside the system tenant, a trusted kind
(`email_send`, `outbox_dispatch`) created by a tenant key, and a `postrelay.*` name outside
the system tenant.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SYSTEM_TENANT = "00000000-0000-0000-0000-000000000000"

# Tenant keys write `api:key:<name>` (HTTP API) or `dashboard:key:<name>` (dashboard) as the
# creator; the service role and the CLI write other actors.
BREAKS_THE_RULES = f"""
    (job_kind = 'cleanup_jobs' AND tenant_id <> '{SYSTEM_TENANT}')
    OR (job_kind IN ('email_send', 'outbox_dispatch')
        AND (created_by LIKE 'api:key:%' OR created_by LIKE 'dashboard:key:%'))
    OR (name LIKE 'postrelay.%' AND tenant_id <> '{SYSTEM_TENANT}')
"""


def upgrade() -> None:
    op.execute(f"""
        WITH deleted AS (
            DELETE FROM mdm.aa_cron_entry WHERE {BREAKS_THE_RULES} RETURNING *
        )
        INSERT INTO mdm.aa_cron_audit (cron_id, name, tenant_id, action, actor, detail)
        SELECT d.id, d.name, d.tenant_id, 'cron_delete', 'migration 0010',
               to_jsonb(d) || jsonb_build_object(
                   'reason', 'reserved kind or name (postrelay/queue/reserved.py)')
        FROM deleted d
    """)
    op.drop_constraint("cron_name_uk", "aa_cron_entry", schema="mdm", type_="unique")
    op.create_unique_constraint("cron_tenant_name_uk", "aa_cron_entry", ["tenant_id", "name"],
                                schema="mdm")


def downgrade() -> None:
    # The old constraint wants one name across the installation: of entries sharing a name,
    # the oldest keeps it and the others get their tenant's id appended (names allow ':').
    op.execute("""
        UPDATE mdm.aa_cron_entry c
        SET name = left(c.name, 90) || ':' || c.tenant_id::text
        FROM (SELECT id, row_number() OVER (PARTITION BY name ORDER BY created_at, id) AS n
              FROM mdm.aa_cron_entry) r
        WHERE c.id = r.id AND r.n > 1
    """)
    op.drop_constraint("cron_tenant_name_uk", "aa_cron_entry", schema="mdm", type_="unique")
    op.create_unique_constraint("cron_name_uk", "aa_cron_entry", ["name"], schema="mdm")
