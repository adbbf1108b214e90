-- The dashboard's reads. Writes go through the queue, cron and relay modules' own functions,
-- so their audit rows are written exactly as the API and the CLI write them.
--
-- :tenant_id is NULL for the service role and the session's tenant for a tenant key: every
-- statement that reads tenant data filters on it, so a tenant session cannot see another
-- tenant's rows whatever the request asks for. The dashboard's engine forces custom plans
-- (see app.py), so `CAST(:x AS …) IS NULL OR …` folds away and each statement is planned
-- with its real filters and indexes.

-- name: api_key_find_by_hash
-- Sign-in with a tenant key: the session remembers the key's id, never the key. A key
-- bound to the system tenant opens nothing (access/sql/api_key.sql, api_key_find_active).
SELECT id, name, tenant_id, key_hash
FROM mdm.aa_api_key
WHERE key_hash = :key_hash AND revoked_at IS NULL
  AND tenant_id <> CAST('00000000-0000-0000-0000-000000000000' AS uuid);

-- name: api_key_get_active
-- Every request of a tenant session: a revoked (or deleted) key ends the session at once.
SELECT k.name, k.tenant_id, t.name AS tenant_name
FROM mdm.aa_api_key k
JOIN mdm.aa_tenant t ON t.id = k.tenant_id
WHERE k.id = :id AND k.revoked_at IS NULL
  AND k.tenant_id <> CAST('00000000-0000-0000-0000-000000000000' AS uuid);

-- name: job_count_live
-- Jobs not done, by (tenant, kind, status): the overview's breakdowns, summed up in Python.
-- `done` is left out because it is the history, which grows without bound: counting it read
-- all of ix_job_tenant_kind on every refresh (about a second beside 10 million done jobs).
-- A loose index scan instead: the recursive part steps from one (tenant, kind) pair of
-- ix_job_tenant_kind to the next with one index descent each, jumping over the pair's done
-- entries; the lateral part counts the pair's four other statuses as index ranges. The cost
-- follows the number of pairs and of jobs not done, whatever the history.
WITH RECURSIVE pairs AS (
    (SELECT tenant_id, job_kind
     FROM mdm.aa_job
     WHERE CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid)
     ORDER BY tenant_id, job_kind
     LIMIT 1)
    UNION ALL
    SELECT next.tenant_id, next.job_kind
    FROM pairs p
    CROSS JOIN LATERAL (
        SELECT j.tenant_id, j.job_kind
        FROM mdm.aa_job j
        WHERE (j.tenant_id, j.job_kind) > (p.tenant_id, p.job_kind)
        ORDER BY j.tenant_id, j.job_kind
        LIMIT 1
    ) next
    -- The tenant test stays out of the index scan above: beside the row comparison, an
    -- equality on tenant_id would become the scan's start and read the tenant's done
    -- entries from the first. Here it ends the walk at the first pair past the tenant's.
    WHERE CAST(:tenant_id AS uuid) IS NULL OR next.tenant_id = CAST(:tenant_id AS uuid)
)
-- One count per status, each an equality on all three columns: with `status IN (...)` the
-- planner, misled by statistics older than a burst of new jobs, chose a bitmap scan of the
-- whole pair, done entries included, and filtered the status on the heap.
SELECT p.tenant_id, p.job_kind::text AS kind, s.status::text AS status, c.n
FROM pairs p
CROSS JOIN unnest(CAST('{pending,running,failed,dlq}' AS mdm.job_status[])) AS s(status)
CROSS JOIN LATERAL (
    SELECT count(*) AS n
    FROM mdm.aa_job j
    WHERE j.tenant_id = p.tenant_id AND j.job_kind = p.job_kind AND j.status = s.status
) c
WHERE c.n > 0;

-- name: job_done_estimate
-- Done jobs in all, as the statistics last counted them: ix_job_done_completed holds one
-- entry per done job, and VACUUM and ANALYZE (autovacuum runs both) record how many.
-- -1 or 0 before the first one. An estimate, and shown as one; `postrelay status` counts.
SELECT CAST(c.reltuples AS bigint) AS n
FROM pg_class c
WHERE c.oid = CAST('mdm.ix_job_done_completed' AS regclass);

-- name: job_done_rollup_until
-- The done rollup's mark: every minute before it is tallied in aa_job_done_minute (NULL:
-- none yet). Read apart from the counts below so that they are planned with it as a
-- constant: as a subquery, the planner took the live range for a third of the done jobs.
SELECT (SELECT until FROM mdm.aa_job_done_rollup) AS until;

-- name: job_done_per_minute
-- Done jobs per minute since :since: the minutes before the rollup's mark (:until) from
-- their tally (aa_job_done_minute, written by the maintenance leader once a minute has
-- closed), the minutes from the mark on counted through ix_job_done_completed. Counting
-- the whole hour read one index entry per job: millions during a fast drain. Each minute
-- is counted once even if the leader moved the mark since it was read: the tally is read
-- only below :until (the leader wrote those rows before or with that mark), the jobs only
-- from it. Without a mark (NULL, which GREATEST skips) the whole hour is counted live.
SELECT minute, CAST(sum(n) AS bigint) AS n
FROM (
    SELECT m.minute, m.done AS n
    FROM mdm.aa_job_done_minute m
    WHERE m.minute >= :since AND m.minute < CAST(:until AS timestamptz)
      AND (CAST(:tenant_id AS uuid) IS NULL OR m.tenant_id = CAST(:tenant_id AS uuid))
    UNION ALL
    SELECT date_trunc('minute', j.completed_at), count(*)
    FROM mdm.aa_job j
    WHERE j.status = 'done'
      AND j.completed_at >= GREATEST(CAST(:since AS timestamptz),
                                     CAST(:until AS timestamptz))
      AND (CAST(:tenant_id AS uuid) IS NULL OR j.tenant_id = CAST(:tenant_id AS uuid))
    GROUP BY 1
) counts
GROUP BY minute;

-- name: job_failed_per_minute
-- Jobs that ended failed or dead-lettered, per minute since :since, through the partial
-- index ix_job_failed_completed (migration 0008).
SELECT date_trunc('minute', completed_at) AS minute, count(*) AS n
FROM mdm.aa_job
WHERE status IN ('failed', 'dlq') AND completed_at >= :since
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
GROUP BY 1;

-- name: job_pending_oldest
-- The due backlog and how long its oldest job has waited, from ix_job_dispatch alone.
SELECT count(*) AS due,
       -- A job made due at '-infinity' by hand is counted, not aged: the subtraction fails.
       CAST(EXTRACT(EPOCH FROM now() - min(available_at) FILTER (WHERE isfinite(available_at)))
            AS float8) AS oldest_age_secs,
       date_trunc('minute', now()) AS this_minute
FROM mdm.aa_job
WHERE status = 'pending' AND available_at <= now()
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid));

-- name: outbox_backlog
-- Unrelayed live events and the age of the oldest, from ix_outbox_unhandled: seq order is
-- insertion order, so the first event by seq is (within a transaction's span) the oldest.
-- The dead count reads ix_outbox_dead (migration 0008).
SELECT (SELECT count(*) FROM mdm.aa_outbox_event
        WHERE handled_at IS NULL AND dead_at IS NULL
          AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid)))
           AS backlog,
       (SELECT CAST(EXTRACT(EPOCH FROM now() - created_at) AS float8)
        FROM mdm.aa_outbox_event
        WHERE handled_at IS NULL AND dead_at IS NULL
          AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
        ORDER BY seq
        LIMIT 1) AS lag_secs,
       (SELECT count(*) FROM mdm.aa_outbox_event
        WHERE dead_at IS NOT NULL
          AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid)))
           AS dead;

-- name: email_log_count_since
-- Email outcomes since :since, one index range per status on ix_email_log_status_time.
SELECT s.status,
       (SELECT count(*) FROM mdm.aa_email_log l
        WHERE l.status = s.status AND l.created_at >= :since) AS n
FROM unnest(CAST(:statuses AS text[])) WITH ORDINALITY AS s(status, ord)
ORDER BY s.ord;

-- name: email_log_count_since_tenant
-- A tenant's email outcomes since :since, from its own range of ix_email_log_tenant_time.
-- Through the status ranges instead (the statement above with a filter), it read every
-- tenant's rows of the day: 166 ms against 18 for a tenant of 20,000 rows in a day of
-- 143,000.
SELECT status, count(*) AS n
FROM mdm.aa_email_log
WHERE tenant_id = CAST(:tenant_id AS uuid) AND created_at >= :since
GROUP BY status;

-- name: job_list_pending
-- Pending jobs in the order workers will take them (ix_job_dispatch).
SELECT id, tenant_id, job_kind::text AS kind, status::text AS status, priority, attempts,
       max_attempts, available_at AS at, last_error, created_at
FROM mdm.aa_job
WHERE status = 'pending'
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
  AND (CAST(:kind AS text) IS NULL OR job_kind = CAST(CAST(:kind AS text) AS mdm.job_kind))
  AND (CAST(:since AS timestamptz) IS NULL OR available_at >= CAST(:since AS timestamptz))
  AND (CAST(:until AS timestamptz) IS NULL OR available_at < CAST(:until AS timestamptz))
ORDER BY priority, available_at, id
LIMIT :limit OFFSET :offset;

-- name: job_list_running
-- Running jobs, the longest-running first (ix_job_claimed_stale).
SELECT id, tenant_id, job_kind::text AS kind, status::text AS status, priority, attempts,
       max_attempts, claimed_at AS at, last_error, created_at
FROM mdm.aa_job
WHERE status = 'running'
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
  AND (CAST(:kind AS text) IS NULL OR job_kind = CAST(CAST(:kind AS text) AS mdm.job_kind))
  AND (CAST(:since AS timestamptz) IS NULL OR claimed_at >= CAST(:since AS timestamptz))
  AND (CAST(:until AS timestamptz) IS NULL OR claimed_at < CAST(:until AS timestamptz))
ORDER BY claimed_at, id
LIMIT :limit OFFSET :offset;

-- name: job_list_finished
-- Done, failed or dead jobs, the most recently finished first. `done` reads
-- ix_job_done_completed backwards, failed and dlq ix_job_failed_completed. The caller
-- validates :status first: a bad enum cast would abort.
-- One cast, straight to the enum: a custom plan then sees the status as a constant and
-- can prove the partial index's predicate (a cast through text is evaluated at run time).
-- The order is the backward index order, NULLS FIRST (finished jobs have completed_at).
SELECT id, tenant_id, job_kind::text AS kind, status::text AS status, priority, attempts,
       max_attempts, completed_at AS at, last_error, created_at
FROM mdm.aa_job
WHERE status = CAST(:status AS mdm.job_status)
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
  AND (CAST(:kind AS text) IS NULL OR job_kind = CAST(CAST(:kind AS text) AS mdm.job_kind))
  AND (CAST(:since AS timestamptz) IS NULL OR completed_at >= CAST(:since AS timestamptz))
  AND (CAST(:until AS timestamptz) IS NULL OR completed_at < CAST(:until AS timestamptz))
ORDER BY completed_at DESC, id DESC
LIMIT :limit OFFSET :offset;

-- name: job_find_by_key
-- Find by idempotency key alone. job_idempotency_uk leads with (tenant_id, job_kind), so
-- the statement probes it once per (tenant, kind) pair; LIMIT 1 (the index is unique)
-- keeps the probe a parameterized lookup instead of a scan of the whole index, and the
-- repeated `NOT LIKE` (the index's predicate) lets the planner use it. The outbox relay's
-- keys, `outbox:<event>:<route>`, are not in that index: they name the job's link. Only
-- a canonical UUID is cast (a text of 36 hex digits and dashes in another shape would
-- fail the cast and abort the statement): the relay writes its keys in that form.
SELECT j.id, j.tenant_id, j.kind, j.status, j.priority, j.attempts, j.max_attempts,
       j.created_at AS at, j.last_error, j.created_at
FROM mdm.aa_tenant t
CROSS JOIN unnest(enum_range(NULL::mdm.job_kind)) AS k(kind)
CROSS JOIN LATERAL (
    SELECT id, tenant_id, job_kind::text AS kind, status::text AS status, priority,
           attempts, max_attempts, last_error, created_at
    FROM mdm.aa_job
    WHERE tenant_id = t.id AND job_kind = k.kind AND idempotency_key = :key
      AND idempotency_key NOT LIKE 'outbox:%'
    LIMIT 1
) j
WHERE CAST(:tenant_id AS uuid) IS NULL OR t.id = CAST(:tenant_id AS uuid)
UNION ALL
SELECT j.id, j.tenant_id, j.job_kind::text, j.status::text, j.priority, j.attempts,
       j.max_attempts, j.created_at, j.last_error, j.created_at
FROM mdm.aa_outbox_delivery d
JOIN mdm.aa_job j ON j.id = d.job_id
WHERE d.event_id = CASE WHEN CAST(:key AS text)
                             ~ '^outbox:[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}:'
                        THEN CAST(substr(CAST(:key AS text), 8, 36) AS uuid) END
  AND d.route = substr(CAST(:key AS text), 45)
  AND (CAST(:tenant_id AS uuid) IS NULL OR j.tenant_id = CAST(:tenant_id AS uuid))
ORDER BY created_at DESC
LIMIT 50;

-- name: job_audit_list
-- A job's audit trail: rows of the job's own tenant only, for the service role too (an
-- audit row of another tenant's naming this job id is not its story), as job_origin does.
SELECT a.id, a.action, a.actor, a.detail, a.created_at
FROM mdm.aa_job_audit a
JOIN mdm.aa_job j ON j.id = a.job_id AND j.tenant_id = a.tenant_id
WHERE a.job_id = :job_id
  AND (CAST(:tenant_id AS uuid) IS NULL OR j.tenant_id = CAST(:tenant_id AS uuid))
ORDER BY a.id;

-- name: job_origin
-- The outbox event (and route) a job was made from, while the event is kept. The delivery
-- links have no tenant column: the job gives it, and a link to another tenant's event is
-- left out (one whose event retention has deleted stays, without the event's fields).
SELECT d.event_id, d.route, e.event_type, e.aggregate_type, e.aggregate_id, e.created_at
FROM mdm.aa_outbox_delivery d
JOIN mdm.aa_job j ON j.id = d.job_id
LEFT JOIN mdm.aa_outbox_event e ON e.id = d.event_id
WHERE d.job_id = :job_id
  AND (e.id IS NULL OR e.tenant_id = j.tenant_id)
  AND (CAST(:tenant_id AS uuid) IS NULL OR j.tenant_id = CAST(:tenant_id AS uuid))
ORDER BY d.created_at
LIMIT 10;

-- name: dlq_list_matching
-- Dead jobs matching the DLQ page's filter, the most recently dead-lettered first: the
-- page's rows and, with a larger limit, the targets of "all matching this filter".
SELECT id, tenant_id, job_kind::text AS kind, status::text AS status, priority, attempts,
       max_attempts, completed_at AS at, last_error, created_at
FROM mdm.aa_job
WHERE status = 'dlq'
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
  AND (CAST(:kind AS text) IS NULL OR job_kind = CAST(CAST(:kind AS text) AS mdm.job_kind))
  AND (CAST(:since AS timestamptz) IS NULL OR completed_at >= CAST(:since AS timestamptz))
  AND (CAST(:until AS timestamptz) IS NULL OR completed_at < CAST(:until AS timestamptz))
ORDER BY completed_at DESC, id DESC
LIMIT :limit;

-- name: dlq_count_matching
SELECT count(*)
FROM mdm.aa_job
WHERE status = 'dlq'
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
  AND (CAST(:kind AS text) IS NULL OR job_kind = CAST(CAST(:kind AS text) AS mdm.job_kind))
  AND (CAST(:since AS timestamptz) IS NULL OR completed_at >= CAST(:since AS timestamptz))
  AND (CAST(:until AS timestamptz) IS NULL OR completed_at < CAST(:until AS timestamptz));

-- name: email_log_of_job
-- A job's email attempts: log rows of the job's own tenant only, for the service role too
-- (a row of another tenant's naming this job id is not its attempt), as job_origin does.
SELECT l.id, l.status, l.attempt, l.recipients, l.subject, l.smtp_code, l.created_at
FROM mdm.aa_email_log l
JOIN mdm.aa_job j ON j.id = l.job_id AND j.tenant_id = l.tenant_id
WHERE l.job_id = :job_id
  AND (CAST(:tenant_id AS uuid) IS NULL OR j.tenant_id = CAST(:tenant_id AS uuid))
ORDER BY l.created_at, l.attempt;

-- name: dlq_list_ids
-- The checked jobs that are (still) in the DLQ, for the confirmation step.
SELECT id, tenant_id, job_kind::text AS kind, status::text AS status, priority, attempts,
       max_attempts, completed_at AS at, last_error, created_at
FROM mdm.aa_job
WHERE id = ANY(CAST(:ids AS uuid[]))
  AND status = 'dlq'
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
ORDER BY completed_at DESC, id DESC;

-- name: dlq_lock_ids
-- The confirmed jobs still dead, with when they were dead-lettered, locked until the
-- action's transaction ends: the action applies to a job only if that is still the death
-- the confirmation showed (one retried and dead-lettered again meanwhile is left alone).
-- In id order, so two actions on overlapping jobs lock them in the same order.
SELECT id, completed_at AS at
FROM mdm.aa_job
WHERE id = ANY(CAST(:ids AS uuid[]))
  AND status = 'dlq'
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
ORDER BY id
FOR UPDATE;
