-- Rate and concurrency limits (and what they leave in aa_flow_audit). Loaded by
-- queue/limits.py; the claim that enforces them is job_claim_limited in job.sql.

-- name: job_limit_kind_lock
-- Taken by a kind-wide limit's set and by a tenant key's, before job_limit_upsert: the two
-- take turns per kind, so each sees what the other committed (else a tenant key's limit
-- made while a kind-wide one was being set escaped both the refusal and the displacement).
SELECT pg_advisory_xact_lock(hashtext('postrelay.job_limit'), hashtext(CAST(:kind AS text)));

-- name: job_limit_upsert
-- Sets the limit of a scope (kind, optional tenant), replacing the one there was; a
-- changed rate or key starts its buckets afresh (full). The claim reads it from its next
-- run on; workers learn that a kind is limited within a second (job_limit_kinds).
-- A kind-wide limit removes the limits tenant keys set on the kind (:tenant_key_actor):
-- a tenant's own limit governs its jobs instead of the kind-wide one, and a tenant key may
-- not take its jobs out of a limit every tenant shares, whichever came first. Limits the
-- operator set within a tenant stay. `displaced` counts what was removed.
-- :tenant_key_only (a tenant key setting) writes nothing where the row as found holds the
-- operator's limit of the scope, or a kind-wide limit of the kind exists: no row comes back,
-- and the caller tells why. It judges what committed before the statement, so an
-- operator's limit made after the caller's own check is not overwritten.
WITH old AS (
    SELECT id, key_path, rate_per_sec, burst, concurrency FROM mdm.aa_job_limit
    WHERE job_kind = CAST(CAST(:kind AS text) AS mdm.job_kind)
      AND tenant_id IS NOT DISTINCT FROM CAST(:tenant_id AS uuid)
), set AS (
    INSERT INTO mdm.aa_job_limit
        (job_kind, tenant_id, key_path, rate_per_sec, burst, concurrency, created_by)
    SELECT CAST(CAST(:kind AS text) AS mdm.job_kind), CAST(:tenant_id AS uuid),
           CAST(:key_path AS text[]), :rate_per_sec, :burst, :concurrency, :actor
    WHERE NOT (CAST(:tenant_key_only AS boolean) AND EXISTS (
        SELECT FROM mdm.aa_job_limit w
        WHERE w.job_kind = CAST(CAST(:kind AS text) AS mdm.job_kind) AND w.tenant_id IS NULL))
    ON CONFLICT ON CONSTRAINT job_limit_scope_uk DO UPDATE
    SET key_path = EXCLUDED.key_path, rate_per_sec = EXCLUDED.rate_per_sec,
        burst = EXCLUDED.burst, concurrency = EXCLUDED.concurrency,
        created_by = EXCLUDED.created_by, created_at = now()
    WHERE NOT CAST(:tenant_key_only AS boolean)
       OR mdm.aa_job_limit.created_by ~ :tenant_key_actor
    RETURNING id, job_kind, tenant_id, key_path, rate_per_sec, burst, concurrency, created_by,
              created_at
), reset AS (
    DELETE FROM mdm.aa_job_limit_bucket b USING old
    WHERE b.limit_id = old.id AND EXISTS (SELECT FROM set)
      AND (old.key_path IS DISTINCT FROM CAST(:key_path AS text[])
           OR old.rate_per_sec IS DISTINCT FROM :rate_per_sec OR old.burst IS DISTINCT FROM :burst)
), audited AS (
    INSERT INTO mdm.aa_flow_audit (action, tenant_id, job_kind, actor, detail)
    SELECT 'limit_set', s.tenant_id, s.job_kind, :actor,
           jsonb_build_object('key_path', s.key_path, 'rate_per_sec', s.rate_per_sec,
                              'burst', s.burst, 'concurrency', s.concurrency,
                              'was', (SELECT to_jsonb(o) - 'id' FROM old o))
    FROM set s
), displaced AS (
    DELETE FROM mdm.aa_job_limit
    WHERE CAST(:tenant_id AS uuid) IS NULL
      AND job_kind = CAST(CAST(:kind AS text) AS mdm.job_kind)
      AND tenant_id IS NOT NULL
      AND created_by ~ :tenant_key_actor
    RETURNING job_kind, tenant_id, key_path, rate_per_sec, burst, concurrency, created_by
), displaced_audited AS (
    INSERT INTO mdm.aa_flow_audit (action, tenant_id, job_kind, actor, detail)
    SELECT 'limit_removed', d.tenant_id, d.job_kind, :actor,
           jsonb_build_object('key_path', d.key_path, 'rate_per_sec', d.rate_per_sec,
                              'burst', d.burst, 'concurrency', d.concurrency,
                              'created_by', d.created_by, 'reason', 'kind_wide_limit')
    FROM displaced d
)
SELECT job_kind::text AS kind, tenant_id, key_path, rate_per_sec, burst, concurrency,
       created_by, created_at, (SELECT count(*) FROM displaced) AS displaced
FROM set;

-- name: job_limit_delete
-- :tenant_key_only (a tenant key removing) deletes only a limit tenant keys set, judged on
-- the row as it is when deleted.
WITH removed AS (
    DELETE FROM mdm.aa_job_limit
    WHERE job_kind = CAST(CAST(:kind AS text) AS mdm.job_kind)
      AND tenant_id IS NOT DISTINCT FROM CAST(:tenant_id AS uuid)
      AND (NOT CAST(:tenant_key_only AS boolean) OR created_by ~ :tenant_key_actor)
    RETURNING job_kind, tenant_id, key_path, rate_per_sec, burst, concurrency, created_by,
              created_at
), audited AS (
    INSERT INTO mdm.aa_flow_audit (action, tenant_id, job_kind, actor, detail)
    SELECT 'limit_removed', r.tenant_id, r.job_kind, :actor,
           jsonb_build_object('key_path', r.key_path, 'rate_per_sec', r.rate_per_sec,
                              'burst', r.burst, 'concurrency', r.concurrency)
    FROM removed r
)
SELECT job_kind::text AS kind, tenant_id, key_path, rate_per_sec, burst, concurrency,
       created_by, created_at
FROM removed;

-- name: job_limit_list
-- Every limit, or with :tenant_id those that govern that tenant's jobs: its own and the
-- kind-wide ones.
SELECT job_kind::text AS kind, tenant_id, key_path, rate_per_sec, burst, concurrency,
       created_by, created_at
FROM mdm.aa_job_limit
WHERE CAST(:tenant_id AS uuid) IS NULL
   OR tenant_id IS NULL
   OR tenant_id = CAST(:tenant_id AS uuid)
ORDER BY job_kind, tenant_id NULLS FIRST;

-- name: job_limit_bucket_prune
-- Buckets idle for longer than a refill from empty to the burst takes: a bucket made afresh
-- starts full, as this one would be by now, so deleting it changes nothing but the table's
-- size (per-key limits over many keys would otherwise keep a row per key forever). One
-- bounded batch; the outer condition is rechecked on a bucket a claim drew meanwhile. The
-- idle time is multiplied by the rate, not compared with burst / rate as an interval: a
-- rate of one job in a few thousand years made that interval overflow the timestamp, and
-- every maintenance round failed on it.
DELETE FROM mdm.aa_job_limit_bucket b
USING mdm.aa_job_limit l
WHERE l.id = b.limit_id
  AND (l.rate_per_sec IS NULL
       OR EXTRACT(EPOCH FROM clock_timestamp() - b.refilled_at) * l.rate_per_sec > l.burst)
  AND (b.limit_id, b.key) IN (
      SELECT i.limit_id, i.key
      FROM mdm.aa_job_limit_bucket i
      JOIN mdm.aa_job_limit il ON il.id = i.limit_id
      WHERE il.rate_per_sec IS NULL
         OR EXTRACT(EPOCH FROM clock_timestamp() - i.refilled_at) * il.rate_per_sec > il.burst
      LIMIT :batch);
