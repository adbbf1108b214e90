-- Throttled destinations (mdm.aa_job_throttle): what a refusal (SMTP 421/454, HTTP
-- 429/503) writes, what the listings read, what maintenance ends. Loaded by
-- queue/throttles.py; the claim that honours them is job_claim_limited in job.sql, and
-- the rate a row allows at a time t is, there and here:
--   0 before paused_until, then LEAST(ceiling_per_sec, rate_per_sec * 2^((t - paused_until)
--   / step_secs)), the ceiling being the configured limit's rate (none: no ceiling).

-- name: job_throttle_refused
-- A refusal of the destination (kind, key_path, key). A new throttle pauses it for
-- :pause_secs, then resumes at half the configured rate (at least :floor_per_sec; the floor
-- itself when no rate is configured). A refusal of a throttled destination that was
-- sending again halves the rate it had reached and pauses again; one that comes during the
-- pause (from sends already under way) only counts and stretches the pause. The upsert
-- makes two workers refused at the same moment agree; job_throttle_settle then works out
-- when the row ends. Its own bucket holds one token at the end of the pause.
WITH configured AS MATERIALIZED (
    SELECT (SELECT rate_per_sec FROM mdm.aa_job_limit
            WHERE job_kind = CAST(CAST(:kind AS text) AS mdm.job_kind)
              AND (tenant_id IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
            ORDER BY tenant_id NULLS LAST
            LIMIT 1) AS rate,
           clock_timestamp() AS now
)
INSERT INTO mdm.aa_job_throttle AS t
    (job_kind, key_path, key, tenant_id, rate_per_sec, ceiling_per_sec, step_secs,
     paused_until, ends_at, tokens, refilled_at, refusals, reason, started_at, changed_at)
SELECT CAST(CAST(:kind AS text) AS mdm.job_kind), CAST(:key_path AS text[]), :key,
       CAST(:tenant_id AS uuid),
       GREATEST(:floor_per_sec, COALESCE(c.rate, :floor_per_sec) / 2), c.rate, :step_secs,
       c.now + make_interval(secs => :pause_secs), c.now + make_interval(secs => :pause_secs),
       1, c.now + make_interval(secs => :pause_secs), 1, :reason, c.now, c.now
FROM configured c
ON CONFLICT ON CONSTRAINT job_throttle_scope_uk DO UPDATE
SET rate_per_sec = CASE
        WHEN EXCLUDED.changed_at < t.paused_until THEN t.rate_per_sec
        ELSE GREATEST(:floor_per_sec, LEAST(
            COALESCE(t.ceiling_per_sec, CAST('Infinity' AS float8)),
            t.rate_per_sec * power(2.0, CAST(EXTRACT(EPOCH FROM EXCLUDED.changed_at
                                                     - t.paused_until) AS float8)
                                        / t.step_secs)) / 2) END,
    ceiling_per_sec = EXCLUDED.ceiling_per_sec,
    step_secs = EXCLUDED.step_secs,
    paused_until = GREATEST(t.paused_until, EXCLUDED.paused_until),
    tokens = 1,
    refilled_at = GREATEST(t.paused_until, EXCLUDED.paused_until),
    refusals = t.refusals + 1,
    reason = EXCLUDED.reason,
    changed_at = EXCLUDED.changed_at
RETURNING t.id, (t.xmax = 0) AS started;

-- name: job_throttle_settle
-- When the throttle just written ends: once its rate, doubling every step from the end of
-- the pause, reaches the ceiling (the configured rate, else :free_per_sec, past which a
-- destination with no configured limit is left unlimited again). A new throttle leaves its
-- `throttle_started` row in aa_flow_audit.
WITH settled AS (
    UPDATE mdm.aa_job_throttle
    SET ends_at = paused_until + make_interval(secs => step_secs * GREATEST(0.0,
            ln(COALESCE(ceiling_per_sec, :free_per_sec) / rate_per_sec) / ln(2.0)))
    WHERE id = :id
    RETURNING job_kind, key_path, key, tenant_id, rate_per_sec, ceiling_per_sec,
              paused_until, ends_at, reason, refusals, started_at
), audited AS (
    INSERT INTO mdm.aa_flow_audit (action, tenant_id, job_kind, actor, detail)
    SELECT 'throttle_started', s.tenant_id, s.job_kind, :actor,
           jsonb_build_object('key_path', s.key_path, 'key', s.key, 'reason', s.reason,
                              'rate_per_sec', s.rate_per_sec,
                              'ceiling_per_sec', s.ceiling_per_sec,
                              'paused_until', s.paused_until, 'ends_at', s.ends_at)
    FROM settled s
    WHERE CAST(:started AS boolean)
)
SELECT job_kind::text AS kind, key, rate_per_sec, paused_until, ends_at, refusals
FROM settled;

-- name: job_throttle_end
-- Throttles whose time is up: deleted, each with its `throttle_ended` row. The claim stopped
-- counting them at ends_at already; this keeps the table to the destinations throttled now.
WITH ended AS (
    DELETE FROM mdm.aa_job_throttle
    WHERE ends_at <= clock_timestamp()
    RETURNING job_kind, key_path, key, tenant_id, reason, refusals, started_at, ends_at
), audited AS (
    INSERT INTO mdm.aa_flow_audit (action, tenant_id, job_kind, actor, detail)
    SELECT 'throttle_ended', e.tenant_id, e.job_kind, :actor,
           jsonb_build_object('key_path', e.key_path, 'key', e.key, 'reason', e.reason,
                              'refusals', e.refusals, 'started_at', e.started_at,
                              'ended_at', e.ends_at)
    FROM ended e
)
SELECT job_kind::text AS kind, key, refusals, started_at, ends_at FROM ended;

-- name: job_throttle_list
-- The destinations throttled now, with the rate each allows at this moment; with
-- :tenant_id, those of that tenant and the shared ones (no tenant).
SELECT job_kind::text AS kind, key_path, key, tenant_id, reason, refusals, started_at,
       paused_until, ends_at, ceiling_per_sec,
       CASE WHEN clock_timestamp() < paused_until THEN 0.0
            ELSE LEAST(COALESCE(ceiling_per_sec, CAST('Infinity' AS float8)),
                       rate_per_sec * power(2.0, CAST(EXTRACT(EPOCH FROM clock_timestamp()
                                                              - paused_until) AS float8)
                                                 / step_secs)) END AS rate_now
FROM mdm.aa_job_throttle
WHERE ends_at > clock_timestamp()
  AND (CAST(:tenant_id AS uuid) IS NULL
       OR tenant_id IS NULL
       OR tenant_id = CAST(:tenant_id AS uuid))
ORDER BY job_kind, key;
