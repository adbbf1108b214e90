-- Statements of the job queue's hot paths: enqueue, finalize, heartbeat, rescue, retention;
-- the claims are in claim.sql. Loaded by queue/queries.py; one thin Python function per
-- statement.

-- name: job_kinds
SELECT unnest(enum_range(NULL::mdm.job_kind))::text AS kind;

-- name: tenant_upsert
-- The tenant called :name, made if there is none. Found, it is read, not locked: ON
-- CONFLICT DO UPDATE locked the row FOR UPDATE until the caller committed, and so held up
-- every other transaction's insert of a job or event of that tenant (its foreign-key check
-- takes KEY SHARE). No row comes back when another transaction made the name after this
-- statement's snapshot was taken (the insert waited for it and did nothing): the caller
-- asks again.
WITH found AS (
    SELECT id FROM mdm.aa_tenant WHERE name = :name
), made AS (
    INSERT INTO mdm.aa_tenant (name)
    SELECT :name WHERE NOT EXISTS (SELECT 1 FROM found)
    ON CONFLICT (name) DO NOTHING
    RETURNING id
)
SELECT id FROM found UNION ALL SELECT id FROM made;

-- name: job_insert
-- Selecting from aa_tenant, and checking the kind against the enum first, turn an unknown
-- tenant or kind into "no row" instead of an error that would abort the caller's
-- transaction. No row can also mean the idempotency key is taken: job_insert_diagnose
-- tells these apart on that rare path, so the common path is one round trip. The id is
-- made by the caller and success read from the row count: a RETURNING row costs the
-- round trip a result description and a row to decode. The wake-up for idle workers rides
-- along when `notify` asks for it, once per transaction (every NOTIFY takes a global lock
-- at commit); it may go out even when no row is written, being only a hint, delivered if
-- the caller commits. The outbox relay's keys (`outbox:` prefix) are not in
-- job_idempotency_uk: its delivery links keep them unique (relay/sql/outbox.sql), which
-- spares each such job three index entries (at its insert, claim and completion, none of
-- them a HOT update), each with a uniqueness check.
WITH wake AS MATERIALIZED (
    SELECT CASE WHEN CAST(:notify AS boolean) THEN pg_notify('postrelay_jobs', '') END
)
INSERT INTO mdm.aa_job
    (id, tenant_id, job_kind, payload, priority, available_at, max_attempts,
     idempotency_key, created_by)
SELECT :id, t.id, CAST(CAST(:kind AS text) AS mdm.job_kind), CAST(:payload AS jsonb), :priority,
       COALESCE(CAST(:run_at AS timestamptz), now() + make_interval(secs => :delay)),
       :max_attempts, :idempotency_key, :created_by
FROM mdm.aa_tenant t CROSS JOIN wake
WHERE t.id = :tenant_id
  AND CAST(:kind AS text) = ANY(CAST(enum_range(NULL::mdm.job_kind) AS text[]))
ON CONFLICT (tenant_id, job_kind, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND idempotency_key NOT LIKE 'outbox:%'
DO NOTHING;

-- name: job_insert_diagnose
-- Why job_insert wrote nothing: unknown tenant, unknown kind, or a taken idempotency key.
-- The repeated `NOT LIKE` lets the planner use job_idempotency_uk, whose predicate it is.
SELECT EXISTS (SELECT 1 FROM mdm.aa_tenant WHERE id = :tenant_id) AS tenant_exists,
       CAST(:kind AS text) = ANY(CAST(enum_range(NULL::mdm.job_kind) AS text[])) AS kind_exists,
       (SELECT id FROM mdm.aa_job
        WHERE tenant_id = :tenant_id AND job_kind::text = :kind
          AND idempotency_key = :idempotency_key
          AND idempotency_key NOT LIKE 'outbox:%') AS existing_id;

-- name: job_batch_check
-- Before a batch insert: which tenants and kinds do not exist (nothing is written if any),
-- and the transaction's now(), from which a copied batch's due times are reckoned. The
-- wake-up for idle workers rides along when wanted, sparing a round trip: it is only a
-- hint, delivered if the caller commits, so the rare batch that writes nothing in the end
-- (every key taken) costs an idle worker one empty claim.
SELECT ARRAY(SELECT t FROM unnest(CAST(:tenant_ids AS uuid[])) AS t
             WHERE NOT EXISTS (SELECT 1 FROM mdm.aa_tenant a WHERE a.id = t)) AS missing_tenants,
       ARRAY(SELECT k FROM unnest(CAST(:kinds AS text[])) AS k
             WHERE k <> ALL(CAST(enum_range(NULL::mdm.job_kind) AS text[]))) AS unknown_kinds,
       now() AS now,
       CASE WHEN CAST(:notify AS boolean) THEN pg_notify('postrelay_jobs', '') END AS notified;

-- name: job_copy_in
-- A batch streams in with binary COPY, about twice as fast as job_insert_many;
-- job_batch_check has already checked every tenant and kind. COPY cannot skip a taken
-- idempotency key, so a batch with keys in job_idempotency_uk runs it in a savepoint and,
-- when one is taken, goes by job_insert_many instead (core/bulkcopy.py). The columns left out take their
-- defaults, as in job_insert_many. The column types are JOB_COPY_TYPES in enqueue.py:
-- keep the two in step.
COPY mdm.aa_job (id, tenant_id, job_kind, payload, priority, available_at, max_attempts,
                 idempotency_key, created_by)
FROM STDIN (FORMAT BINARY)

-- name: job_find_by_keys
-- The `NOT LIKE` is job_idempotency_uk's predicate, repeated so that the planner uses it.
SELECT idempotency_key, id FROM mdm.aa_job
WHERE tenant_id = :tenant_id
  AND job_kind = CAST(:kind AS mdm.job_kind)
  AND idempotency_key = ANY(CAST(:keys AS text[]))
  AND idempotency_key NOT LIKE 'outbox:%';

-- name: job_insert_many
-- One round trip for a whole batch. The rows travel as one JSON array of arrays
-- [id, tenant_id, kind, priority, run_at, delay, max_attempts, idempotency_key, payload]:
-- the server parses it in C, where binding thousands of array elements one by one costs
-- more than the insert. Ids are made by the caller so that it knows, without relying on
-- RETURNING order, which rows a taken idempotency key skipped.
INSERT INTO mdm.aa_job
    (id, tenant_id, job_kind, payload, priority, available_at, max_attempts,
     idempotency_key, created_by)
SELECT CAST(r->>0 AS uuid), CAST(r->>1 AS uuid), CAST(r->>2 AS mdm.job_kind), r->8,
       CAST(r->>3 AS smallint),
       COALESCE(CAST(r->>4 AS timestamptz),
                now() + make_interval(secs => CAST(r->>5 AS float8))),
       CAST(r->>6 AS integer), r->>7, :created_by
FROM jsonb_array_elements(CAST(:rows AS jsonb)) AS r
ON CONFLICT (tenant_id, job_kind, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND idempotency_key NOT LIKE 'outbox:%'
DO NOTHING
RETURNING id;

-- name: job_notify
SELECT pg_notify('postrelay_jobs', '');

-- name: job_finalize_many
-- Writes the outcome of a batch of runs. Each row is guarded by the state it expects
-- (still running, claimed by this worker, at the attempt this worker ran): a job that was
-- rescued and claimed again meanwhile is left alone, so a late finish cannot overwrite the
-- rescue. Dead-lettered jobs get their `job_dlq` audit row in the same statement.
WITH outcome AS (
    SELECT * FROM unnest(
        CAST(:ids AS uuid[]), CAST(:attempts AS integer[]), CAST(:statuses AS text[]),
        CAST(:delays AS float8[]), CAST(:errors AS text[]), CAST(:refunds AS boolean[])
    ) AS o(id, attempts, status, delay, error, refund)
), finalized AS (
    UPDATE mdm.aa_job j
    SET status = CAST(o.status AS mdm.job_status),
        available_at = CASE WHEN o.delay IS NULL THEN j.available_at
                            ELSE now() + make_interval(secs => o.delay) END,
        last_error = COALESCE(o.error, j.last_error),
        completed_at = CASE WHEN o.status IN ('done', 'dlq', 'failed') THEN now() END,
        attempts = CASE WHEN o.refund THEN j.attempts - 1 ELSE j.attempts END
    FROM outcome o
    WHERE j.id = o.id
      AND j.status = 'running'
      AND j.claimed_by = :worker
      AND j.attempts = o.attempts
    RETURNING j.id, j.tenant_id, j.job_kind, j.status, j.attempts, j.last_error
), audited AS (
    INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, actor, detail)
    SELECT f.id, f.tenant_id, f.job_kind, 'job_dlq', :worker,
           jsonb_build_object('attempts', f.attempts, 'last_error', f.last_error)
    FROM finalized f
    WHERE f.status = 'dlq'
)
SELECT id FROM finalized;

-- name: job_complete_many
-- job_finalize_many for a batch whose runs all succeeded, the usual case: two arrays to
-- send instead of six, no per-row CASEs, no audit. Guarded the same way. Planned once per
-- connection (job_complete_plan), not for every batch: the rows are found by primary key
-- from the array whatever the estimates, since the status is compared as text, which no
-- partial index's predicate matches (`status = 'running'` made a generic plan walk every
-- running job of every worker).
UPDATE mdm.aa_job j
SET status = 'done', completed_at = now()
FROM unnest(CAST(:ids AS uuid[]), CAST(:attempts AS integer[])) AS o(id, attempts)
WHERE j.id = ANY(CAST(:ids AS uuid[])) AND j.id = o.id
  AND CAST(j.status AS text) = 'running'
  AND j.claimed_by = :worker
  AND j.attempts = o.attempts
RETURNING j.id;

-- name: job_complete_plan
-- Sent ahead of job_complete_many, in its transaction: keep one plan (the worker's
-- connections otherwise force custom plans, for job_finalize_many's sake); never a
-- sequential scan, which a plan made while the table was empty (a fresh install, a
-- truncate) would otherwise keep once the table is large; and never a nested loop, which a
-- plan that expects ten rows from the arrays takes and which grows with the square of the
-- batch (the arrays are hashed instead).
SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('enable_seqscan', 'off', true),
       set_config('enable_nestloop', 'off', true);

-- name: job_complete_plan_no_flush
-- job_complete_plan in a transaction whose commit does not wait for the WAL flush (outcomes
-- with effects: queue/completer.py says why); the setting counts at the commit, wherever
-- in the transaction it is made.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('enable_seqscan', 'off', true),
       set_config('enable_nestloop', 'off', true),
       set_config('synchronous_commit', 'off', true);

-- name: job_outcome_no_flush
-- The same for job_finalize_many's transaction.
SELECT set_config('synchronous_commit', 'off', true);

-- name: job_rescue_stale
-- A running job whose claim is older than the lease and whose worker has stopped
-- heartbeating was lost with its worker: back to pending, or to the DLQ when that claim
-- was its last attempt. A live worker keeps beating, so its long jobs stay put.
-- :now is the database's clock unless a test passes one: claimed_at and heartbeat_at are
-- written by it, and a leader whose host clock ran ahead by more than the lease would
-- otherwise take the jobs of every live worker (and run them twice). A leader stalled
-- before its commit (SIGSTOP, a frozen VM) would keep the rows locked, out of every other
-- rescue and claim: the transaction ends itself once idle for 5 s.
-- Claim times no claim writes come from SQL written by hand (an operator's, another
-- language's): none at all, or one ahead of the database's clock by more than a lease, more
-- than a stepped-back clock explains ('infinity' among them, never older than anything).
-- Such a job is stale as soon as no live worker holds it, or it would stay `running` for
-- ever. Its audit row names no claim moment, as there was none (the email attempt reads
-- that moment as a time: orchestrator/attempts.py); last_error keeps what was written.
WITH clock AS MATERIALIZED (
    SELECT COALESCE(CAST(:now AS timestamptz), now()) AS now,
           make_interval(secs => :lease_secs) AS lease,
           set_config('idle_in_transaction_session_timeout', '5s', true) AS stall_limit
), stale AS (
    SELECT j.id
    FROM mdm.aa_job j, clock c
    WHERE j.status = 'running'
      AND (j.claimed_at < c.now - c.lease
           OR j.claimed_at IS NULL
           OR j.claimed_at > c.now + c.lease)
      AND NOT EXISTS (
          SELECT 1 FROM mdm.aa_worker w
          WHERE w.id = j.claimed_by
            AND w.heartbeat_at >= c.now - c.lease
      )
    ORDER BY j.claimed_at
    LIMIT :limit
    FOR UPDATE OF j SKIP LOCKED
), rescued AS (
    UPDATE mdm.aa_job j
    SET status = CAST(CASE WHEN j.attempts >= j.max_attempts THEN 'dlq' ELSE 'pending' END
                      AS mdm.job_status),
        available_at = (SELECT now FROM clock),
        completed_at = CASE WHEN j.attempts >= j.max_attempts THEN (SELECT now FROM clock) END,
        last_error = 'lease expired: worker ' || coalesce(j.claimed_by, '?')
                     || ' stopped heartbeating; claimed at '
                     || coalesce(j.claimed_at::text, '?')
    FROM stale
    WHERE j.id = stale.id
    RETURNING j.id, j.tenant_id, j.job_kind, j.status, j.attempts, j.claimed_by, j.claimed_at,
              j.last_error
), audited AS (
    -- The lost claim is named whole (worker, attempt, moment): a handler that must know
    -- whether its job's earlier attempt got anywhere reads it (orchestrator/attempts.py).
    -- A moment no claim could have had (see above, and before 1970, which the attempt's
    -- log id cannot hold) is named as none.
    INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, actor, detail)
    SELECT r.id, r.tenant_id, r.job_kind,
           CASE WHEN r.status = 'dlq' THEN 'job_dlq' ELSE 'job_rescued' END, :actor,
           jsonb_build_object('attempts', r.attempts, 'claimed_by', r.claimed_by,
                              'claimed_at',
                              CASE WHEN r.claimed_at >= TIMESTAMPTZ '1970-01-01 00:00:00+00'
                                    AND r.claimed_at <= c.now + c.lease
                                   THEN r.claimed_at END,
                              'last_error', r.last_error)
    FROM rescued r, clock c
)
SELECT id, status::text AS status FROM rescued;

-- name: database_now
-- The database's clock, which completed_at and created_at are written with: retention
-- windows are measured on it, whatever the clock of the worker's host says.
SELECT now();

-- name: job_delete_done_before
-- Retention: one bounded batch of old done jobs. DLQ, failed and pending rows are never
-- touched. SKIP LOCKED keeps two cleaners from waiting on each other.
WITH doomed AS (
    SELECT id FROM mdm.aa_job
    WHERE status = 'done' AND completed_at < CAST(:before AS timestamptz)
    ORDER BY completed_at
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
)
DELETE FROM mdm.aa_job j USING doomed WHERE j.id = doomed.id;

-- name: job_audit_delete_before
-- Retention of the job audit (POSTRELAY_AUDIT_RETENTION_DAYS; kept when unset): one
-- bounded batch, oldest first, by ix_job_audit_time.
DELETE FROM mdm.aa_job_audit
WHERE id IN (SELECT id FROM mdm.aa_job_audit
             WHERE created_at < CAST(:before AS timestamptz)
             ORDER BY created_at
             LIMIT :batch);

-- name: cron_audit_delete_before
-- The same for the cron audit, by ix_cron_audit_time.
DELETE FROM mdm.aa_cron_audit
WHERE id IN (SELECT id FROM mdm.aa_cron_audit
             WHERE created_at < CAST(:before AS timestamptz)
             ORDER BY created_at
             LIMIT :batch);

-- name: flow_audit_delete_before
-- The same for the flow audit (pauses, resumes, limits), by ix_flow_audit_time.
DELETE FROM mdm.aa_flow_audit
WHERE id IN (SELECT id FROM mdm.aa_flow_audit
             WHERE created_at < CAST(:before AS timestamptz)
             ORDER BY created_at
             LIMIT :batch);

-- name: worker_register
INSERT INTO mdm.aa_worker (id, host, pid, tenants, kinds, concurrency)
VALUES (:id, :host, :pid, CAST(:tenants AS uuid[]), CAST(:kinds AS text[]), :concurrency)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now();

-- name: worker_heartbeat
UPDATE mdm.aa_worker SET heartbeat_at = now() WHERE id = :id;

-- name: worker_delete
DELETE FROM mdm.aa_worker WHERE id = :id;

-- name: worker_delete_dead
-- :now as in job_rescue_stale: the database's clock unless a test passes one.
DELETE FROM mdm.aa_worker
WHERE heartbeat_at < COALESCE(CAST(:now AS timestamptz), now())
                     - make_interval(secs => :lease_secs);

-- name: lease_acquire
-- Take or renew the named lease; a row comes back only to the holder.
INSERT INTO mdm.aa_lease (name, holder, expires_at)
VALUES (:name, :holder, now() + make_interval(secs => :ttl_secs))
ON CONFLICT (name) DO UPDATE
SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
WHERE mdm.aa_lease.holder = EXCLUDED.holder OR mdm.aa_lease.expires_at < now()
RETURNING holder;

-- name: lease_take
-- The named lease for a holder that owns it by other means (the maintenance leader's
-- advisory lock), whatever the row said: the row only names the leader.
INSERT INTO mdm.aa_lease (name, holder, expires_at)
VALUES (:name, :holder, now() + make_interval(secs => :ttl_secs))
ON CONFLICT (name) DO UPDATE
SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at;

-- name: leader_try_lock
-- The maintenance leader's session-level advisory lock, on a connection of its own: freed
-- by PostgreSQL when that connection drops, however its process ended. Never behind a
-- transaction pooler, which has no sessions to hold it in.
SELECT pg_try_advisory_lock(:key);

-- name: leader_idle_timeout
-- The lock's connection is closed by the server once it has been idle this long: a leader
-- that stops leading without dying (SIGSTOP, a frozen VM, a blocked event loop) keeps its
-- connection open, and without this its lock too, and nobody rescues anything until it
-- comes back. The leader uses the connection every round, so only a missed round lets it go.
SELECT set_config('idle_session_timeout', CAST(:timeout_ms AS text), false);

-- name: leader_unlock
-- A leader that stops hands the lock over at once: closing its connection frees the lock
-- too, but only once the server has seen the connection go.
SELECT pg_advisory_unlock(:key);

-- name: lease_release
DELETE FROM mdm.aa_lease WHERE name = :name AND holder = :holder;

-- name: job_release_orphans
-- Jobs running under a live worker that does not know it has them: a claim whose reply
-- was lost (the connection cut right at COMMIT), or an outcome the server lost in a crash
-- after the worker had seen its commit (outcomes do not wait for the disk). The worker's
-- heartbeat would keep the rescuer away for good, so the worker hands back what it holds in
-- the database but not in memory, giving the attempt back. The handler may have run (the
-- second case), so the hand-back is audited as a rescue that names the lost claim, as the
-- rescuer's are: an email attempt learns from it that its message may have left
-- (orchestrator/attempts.py). :min_age_secs keeps a claim that is still on its way to
-- memory out of it.
WITH released AS (
    UPDATE mdm.aa_job j
    SET status = 'pending', attempts = j.attempts - 1, available_at = now()
    WHERE j.status = 'running'
      AND j.claimed_by = :worker
      AND j.claimed_at < now() - make_interval(secs => :min_age_secs)
      AND j.id <> ALL(CAST(:known AS uuid[]))
    RETURNING j.id, j.tenant_id, j.job_kind, j.attempts + 1 AS attempt, j.claimed_by,
              j.claimed_at
), audited AS (
    INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, actor, detail)
    SELECT r.id, r.tenant_id, r.job_kind, 'job_rescued', :worker,
           jsonb_build_object('attempts', r.attempt, 'claimed_by', r.claimed_by,
                              'claimed_at', r.claimed_at, 'orphaned', true)
    FROM released r
)
SELECT id FROM released;

-- name: job_cancel_take
-- The cancel requests for jobs this worker holds, taken (deleted) as they are read: the
-- jobs are already `failed` (admin.sql, job_cancel); the worker cancels their tasks.
-- An index probe per held job, asked about twice a second while the worker holds any.
DELETE FROM mdm.aa_job_cancel
WHERE job_id = ANY(CAST(:ids AS uuid[]))
RETURNING job_id, actor;

-- name: job_cancel_missed
-- The jobs this worker holds that were cancelled while its row was gone: a worker silent
-- for longer than the lease (stopped, frozen, cut off) has its row pruned as dead, and the
-- requests addressed to it with it (job_cancel_prune), but it may come back. The job row
-- still tells: `failed` under this worker's claim while the worker still runs it, which
-- only a cancel (job_cancel) makes, the worker's own outcome coming after the run; who
-- cancelled it is in its newest `job_cancelled` audit row. Asked each time the worker
-- registers again.
SELECT j.id AS job_id,
       COALESCE((SELECT a.actor FROM mdm.aa_job_audit a
                 WHERE a.job_id = j.id AND a.action = 'job_cancelled'
                 ORDER BY a.id DESC LIMIT 1), 'unknown') AS actor
FROM mdm.aa_job j
WHERE j.id = ANY(CAST(:ids AS uuid[])) AND j.status = 'failed' AND j.claimed_by = :worker;

-- name: job_cancel_prune
-- Requests whose worker is gone: it died before taking them, and its job is failed
-- already; or it was only silent for longer than the lease, and asks its jobs' states
-- when it registers again (job_cancel_missed), so the cancel is not lost with the request.
DELETE FROM mdm.aa_job_cancel c
WHERE NOT EXISTS (SELECT 1 FROM mdm.aa_worker w WHERE w.id = c.claimed_by);
