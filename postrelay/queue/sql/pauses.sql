-- Pauses (and what they leave in aa_flow_audit). Loaded by queue/pauses.py.
-- A scope is (tenant, kind), either or both NULL for "every"; IS NOT DISTINCT FROM finds
-- the one row of a scope, as the NULLS NOT DISTINCT key job_pause_scope_uk keeps it.

-- name: job_pause_insert
-- Pauses a scope; nothing comes back when it is paused already (the existing pause
-- stands, with its own time and actor, and no audit row is written twice).
WITH paused AS (
    INSERT INTO mdm.aa_job_pause (tenant_id, job_kind, paused_by)
    VALUES (CAST(:tenant_id AS uuid), CAST(CAST(:kind AS text) AS mdm.job_kind), :actor)
    ON CONFLICT ON CONSTRAINT job_pause_scope_uk DO NOTHING
    RETURNING tenant_id, job_kind, paused_by, paused_at
), audited AS (
    INSERT INTO mdm.aa_flow_audit (action, tenant_id, job_kind, actor)
    SELECT 'paused', p.tenant_id, p.job_kind, :actor FROM paused p
)
SELECT tenant_id, job_kind::text AS kind, paused_by, paused_at FROM paused;

-- name: job_pause_take_over
-- An operator pausing a scope a tenant key paused takes the pause over (its time stays):
-- kept as the key's, the key could lift what the operator had just been told was paused.
-- Rows of other actors are left as they are (pausing what is paused keeps the first pause).
WITH old AS (
    SELECT id, paused_by FROM mdm.aa_job_pause
    WHERE tenant_id IS NOT DISTINCT FROM CAST(:tenant_id AS uuid)
      AND job_kind IS NOT DISTINCT FROM CAST(CAST(:kind AS text) AS mdm.job_kind)
      AND paused_by ~ :tenant_key_actor
    FOR UPDATE
), taken AS (
    UPDATE mdm.aa_job_pause p SET paused_by = :actor
    FROM old WHERE p.id = old.id
    RETURNING p.tenant_id, p.job_kind, p.paused_by, p.paused_at, old.paused_by AS was
), audited AS (
    INSERT INTO mdm.aa_flow_audit (action, tenant_id, job_kind, actor, detail)
    SELECT 'paused', t.tenant_id, t.job_kind, :actor,
           jsonb_build_object('taken_over_from', t.was, 'paused_at', t.paused_at)
    FROM taken t
)
SELECT tenant_id, job_kind::text AS kind, paused_by, paused_at FROM taken;

-- name: job_pause_get
SELECT tenant_id, job_kind::text AS kind, paused_by, paused_at
FROM mdm.aa_job_pause
WHERE tenant_id IS NOT DISTINCT FROM CAST(:tenant_id AS uuid)
  AND job_kind IS NOT DISTINCT FROM CAST(CAST(:kind AS text) AS mdm.job_kind);

-- name: job_pause_delete
-- Resumes a scope: exactly that row, not narrower pauses inside it. The audit row keeps
-- who had paused it and since when. :tenant_key_only (a tenant key resuming) deletes only a
-- pause tenant keys made, judged on the row as it is when deleted: an operator's pause or
-- take-over that commits after the caller looked cannot be lifted in between.
WITH resumed AS (
    DELETE FROM mdm.aa_job_pause
    WHERE tenant_id IS NOT DISTINCT FROM CAST(:tenant_id AS uuid)
      AND job_kind IS NOT DISTINCT FROM CAST(CAST(:kind AS text) AS mdm.job_kind)
      AND (NOT CAST(:tenant_key_only AS boolean) OR paused_by ~ :tenant_key_actor)
    RETURNING tenant_id, job_kind, paused_by, paused_at
), audited AS (
    INSERT INTO mdm.aa_flow_audit (action, tenant_id, job_kind, actor, detail)
    SELECT 'resumed', r.tenant_id, r.job_kind, :actor,
           jsonb_build_object('paused_by', r.paused_by, 'paused_at', r.paused_at)
    FROM resumed r
)
SELECT tenant_id, job_kind::text AS kind, paused_by, paused_at FROM resumed;

-- name: job_pause_list
-- Every pause, or with :tenant_id those that hold that tenant's jobs back: its own and
-- the installation-wide ones (every tenant, or a kind in every tenant).
SELECT tenant_id, job_kind::text AS kind, paused_by, paused_at
FROM mdm.aa_job_pause
WHERE CAST(:tenant_id AS uuid) IS NULL
   OR tenant_id IS NULL
   OR tenant_id = CAST(:tenant_id AS uuid)
ORDER BY paused_at, id;
