-- Readiness: the revision the database was migrated to (the table is
-- postrelay.core.migrate.VERSION_TABLE in schema mdm).

-- name: migration_revision
SELECT version_num FROM mdm.alembic_version_postrelay;
