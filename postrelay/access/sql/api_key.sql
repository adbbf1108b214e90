-- Tenant-scoped API keys. Only the sha256 (hex) of a key is stored; see postrelay/access/keys.py.

-- name: api_key_insert
-- Selecting from aa_tenant turns an unknown tenant into "no row"; a taken name is "no row"
-- too. api_key_insert_diagnose tells them apart.
INSERT INTO mdm.aa_api_key (name, tenant_id, key_hash, created_by)
SELECT :name, t.id, :key_hash, :actor
FROM mdm.aa_tenant t
WHERE t.id = :tenant_id
ON CONFLICT (name) DO NOTHING
RETURNING id, name, tenant_id, created_at, created_by, revoked_at, revoked_by;

-- name: api_key_insert_diagnose
SELECT EXISTS (SELECT 1 FROM mdm.aa_tenant WHERE id = :tenant_id) AS tenant_exists,
       EXISTS (SELECT 1 FROM mdm.aa_api_key WHERE name = :name) AS name_taken;

-- name: api_key_list
SELECT id, name, tenant_id, created_at, created_by, revoked_at, revoked_by
FROM mdm.aa_api_key
ORDER BY name;

-- name: api_key_revoke
-- Revoking twice keeps the first revocation: its time and who made it.
UPDATE mdm.aa_api_key
SET revoked_at = COALESCE(revoked_at, now()),
    revoked_by = CASE WHEN revoked_at IS NULL THEN :actor ELSE revoked_by END
WHERE name = :name
RETURNING id, name, tenant_id, created_at, created_by, revoked_at, revoked_by;

-- name: api_key_find_active
-- By hash: the key is 256 random bits, so an index lookup on its hash reveals nothing that
-- a timing attack could use (the caller still compares the hash in constant time).
-- A key bound to the system tenant (SYSTEM_TENANT_ID) is no key: its rows are postrelay's
-- own (retention, maintenance). api_key_create refuses to make one, but one made before it
-- did, or written by hand, would still pause or cancel retention for every tenant.
SELECT name, tenant_id, key_hash
FROM mdm.aa_api_key
WHERE key_hash = :key_hash AND revoked_at IS NULL
  AND tenant_id <> CAST('00000000-0000-0000-0000-000000000000' AS uuid);
