-- Operator statements: queue status, reading jobs, and the dead-letter queue (retry,
-- requeue, discard). Loaded by queue/admin.py; one thin Python function per statement.
--
-- :tenant_id is optional everywhere: NULL means every tenant; a value scopes the statement
-- to that tenant's jobs, so another tenant's job behaves exactly as a missing one.
-- Every mutation writes its aa_job_audit rows in the same statement (data-modifying CTE):
-- there is no window in which a job changed without its audit row, or the reverse.

-- name: job_status_counts
-- Every job by (tenant, kind, status), exact; queue_status sums the three breakdowns in
-- Python. Grouping by all three columns of ix_job_tenant_kind in its own order lets
-- PostgreSQL count from an index-only scan with a streaming aggregate, where GROUPING SETS
-- would hash every row three times (bench/README.md, "Figures behind the code"). It still
-- reads every job: `postrelay status` and /metrics are exact.
SELECT tenant_id, job_kind::text AS kind, status::text AS status, count(*) AS n
FROM mdm.aa_job
WHERE CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid)
GROUP BY tenant_id, job_kind, status;

-- name: job_pending_due
-- Pending jobs that are already due: the backlog workers have not caught up with yet.
-- Jobs waiting for a later available_at (backoff, delay) are not late and do not count.
SELECT count(*) AS due,
       -- A job made due at '-infinity' by hand is counted, not aged: the subtraction fails.
       CAST(EXTRACT(EPOCH FROM now() - min(available_at) FILTER (WHERE isfinite(available_at)))
            AS float8) AS oldest_age_secs
FROM mdm.aa_job
WHERE status = 'pending'
  AND available_at <= now()
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid));

-- name: job_get
SELECT id, tenant_id, job_kind::text AS kind, status::text AS status, payload, priority,
       available_at, attempts, max_attempts, last_error, claimed_by, claimed_at,
       completed_at, idempotency_key, created_at, created_by
FROM mdm.aa_job
WHERE id = :id
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid));

-- name: job_list
-- Newest first. The caller validates status and kind first: a bad enum cast would abort
-- the caller's transaction.
SELECT id, tenant_id, job_kind::text AS kind, status::text AS status, payload, priority,
       available_at, attempts, max_attempts, last_error, claimed_by, claimed_at,
       completed_at, idempotency_key, created_at, created_by
FROM mdm.aa_job
WHERE (CAST(:status AS text) IS NULL OR status = CAST(CAST(:status AS text) AS mdm.job_status))
  AND (CAST(:kind AS text) IS NULL OR job_kind = CAST(CAST(:kind AS text) AS mdm.job_kind))
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: dlq_list
-- The most recently dead-lettered first: that is what an operator looks at after an alert.
SELECT id, tenant_id, job_kind::text AS kind, status::text AS status, payload, priority,
       available_at, attempts, max_attempts, last_error, claimed_by, claimed_at,
       completed_at, idempotency_key, created_at, created_by
FROM mdm.aa_job
WHERE status = 'dlq'
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
ORDER BY completed_at DESC NULLS LAST, id DESC
LIMIT :limit;

-- name: dlq_retry
-- One dead job back to pending, due now. Attempts are NOT reset: the next claim takes
-- attempts past max_attempts, so the job gets exactly one more try and a failure sends it
-- straight back to the DLQ. The status guard makes a concurrent retry or discard of the
-- same job find nothing (it re-checks the row after waiting for the other's lock).
WITH retried AS (
    UPDATE mdm.aa_job
    SET status = 'pending', available_at = now(), completed_at = NULL
    WHERE id = :id
      AND status = 'dlq'
      AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
    RETURNING *
), audited AS (
    INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, actor, detail)
    SELECT r.id, r.tenant_id, r.job_kind, 'job_retry', :actor,
           jsonb_build_object('attempts', r.attempts, 'max_attempts', r.max_attempts,
                              'last_error', r.last_error)
    FROM retried r
)
SELECT id, tenant_id, job_kind::text AS kind, status::text AS status, payload, priority,
       available_at, attempts, max_attempts, last_error, claimed_by, claimed_at,
       completed_at, idempotency_key, created_at, created_by
FROM retried;

-- name: dlq_requeue
-- A bounded batch of dead jobs back to pending, oldest death first; call again for the
-- rest. MATERIALIZED fences the locking subquery so the planner cannot fold it into the
-- UPDATE and lock more rows than LIMIT; SKIP LOCKED lets a concurrent requeue (or a retry
-- or discard holding a row) pass by instead of waiting. Attempts are kept, as in dlq_retry.
WITH dead AS MATERIALIZED (
    SELECT id
    FROM mdm.aa_job
    WHERE status = 'dlq'
      AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
    ORDER BY completed_at NULLS FIRST, created_at, id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), requeued AS (
    UPDATE mdm.aa_job j
    SET status = 'pending', available_at = now(), completed_at = NULL
    FROM dead
    WHERE j.id = dead.id
    RETURNING j.id, j.tenant_id, j.job_kind, j.attempts, j.max_attempts, j.last_error
), audited AS (
    INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, actor, detail)
    SELECT r.id, r.tenant_id, r.job_kind, 'job_requeue', :actor,
           jsonb_build_object('attempts', r.attempts, 'max_attempts', r.max_attempts,
                              'last_error', r.last_error)
    FROM requeued r
)
SELECT count(*) AS requeued FROM requeued;

-- name: dlq_discard
-- Deletes one dead job. The audit row keeps the whole job as it was (to_jsonb of the
-- deleted row), since aa_job no longer will.
WITH discarded AS (
    DELETE FROM mdm.aa_job
    WHERE id = :id
      AND status = 'dlq'
      AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
    RETURNING *
), audited AS (
    INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, actor, detail)
    SELECT d.id, d.tenant_id, d.job_kind, 'job_discard', :actor, to_jsonb(d)
    FROM discarded d
    RETURNING job_id
)
SELECT job_id FROM audited;

-- name: tenant_list
SELECT id, name, created_at FROM mdm.aa_tenant ORDER BY name;

-- name: job_cancel
-- Cancels one job (:id) or every job matching the filters, at most :limit: pending ones
-- (scheduled ones too) and running ones become `failed` at once, with last_error naming
-- who cancelled them and when, and a `job_cancelled` audit row. A running job also gets a
-- row in aa_job_cancel for its worker, which cancels the handler's task within a second;
-- the worker's late outcome finds the job no longer running and is dropped
-- (job_finalize_many's guard), so it is never retried. Filters: :kinds, :tenant_id,
-- created in [:created_from, :created_to), :event_id (the outbox event the job was made
-- from, by aa_outbox_delivery), :template (an email_send payload's template). SKIP LOCKED:
-- a job a worker is finalizing right now is passed by (a single cancel then reports it by
-- its state, job_cancel_state). MATERIALIZED keeps LIMIT a bound on the rows locked.
WITH target AS MATERIALIZED (
    SELECT j.id, j.status AS was
    FROM mdm.aa_job j
    WHERE j.status IN ('pending', 'running')
      AND (CAST(:id AS uuid) IS NULL OR j.id = CAST(:id AS uuid))
      AND (CAST(:tenant_id AS uuid) IS NULL OR j.tenant_id = CAST(:tenant_id AS uuid))
      AND (CAST(:kinds AS text[]) IS NULL OR j.job_kind::text = ANY(CAST(:kinds AS text[])))
      AND (CAST(:created_from AS timestamptz) IS NULL
           OR j.created_at >= CAST(:created_from AS timestamptz))
      AND (CAST(:created_to AS timestamptz) IS NULL
           OR j.created_at < CAST(:created_to AS timestamptz))
      AND (CAST(:template AS text) IS NULL
           OR (j.job_kind = 'email_send' AND j.payload->>'template' = CAST(:template AS text)))
      AND (CAST(:event_id AS uuid) IS NULL OR EXISTS (
           SELECT 1 FROM mdm.aa_outbox_delivery d
           WHERE d.event_id = CAST(:event_id AS uuid) AND d.job_id = j.id))
    ORDER BY j.created_at, j.id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), cancelled AS (
    UPDATE mdm.aa_job j
    SET status = 'failed', completed_at = now(),
        last_error = 'cancelled by ' || CAST(:actor AS text) || ' at '
                     || to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                     || CASE WHEN j.status = 'running' THEN ' while running' ELSE '' END
    FROM target t
    WHERE j.id = t.id
    RETURNING j.id, j.tenant_id, j.job_kind, j.attempts, j.last_error, j.claimed_by, t.was
), requested AS (
    INSERT INTO mdm.aa_job_cancel (job_id, claimed_by, actor)
    SELECT c.id, c.claimed_by, :actor FROM cancelled c
    WHERE c.was = 'running' AND c.claimed_by IS NOT NULL
    ON CONFLICT (job_id) DO NOTHING
), audited AS (
    INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, actor, detail)
    SELECT c.id, c.tenant_id, c.job_kind, 'job_cancelled', :actor,
           jsonb_build_object('was', c.was, 'attempts', c.attempts,
                              'claimed_by', c.claimed_by, 'last_error', c.last_error)
    FROM cancelled c
)
SELECT id, job_kind::text AS kind, was::text AS was FROM cancelled;

-- name: job_cancel_state
-- Why a single cancel found nothing: the job's status, or no row (unknown, or another
-- tenant's).
SELECT status::text AS status FROM mdm.aa_job
WHERE id = :id
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid));

-- name: tenant_exists
SELECT EXISTS (SELECT 1 FROM mdm.aa_tenant WHERE id = :id);
