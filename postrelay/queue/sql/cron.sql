-- Cron entries: created and deleted by operators, fired by the scheduler in every worker.

-- name: cron_insert
-- Selecting from aa_tenant and checking the kind first turn an unknown tenant or kind into
-- "no row" rather than an error that would abort the caller's transaction; a taken name is
-- "no row" too. cron_insert_diagnose tells these apart. The audit row is written in the
-- same statement. Names are unique per tenant (cron_tenant_name_uk, migration 0010): two
-- tenants may each have a `nightly`, and a taken name says nothing about other tenants.
WITH created AS (
    INSERT INTO mdm.aa_cron_entry
        (name, tenant_id, schedule, job_kind, payload, priority, max_attempts, created_by)
    SELECT :name, t.id, :schedule, CAST(CAST(:kind AS text) AS mdm.job_kind),
           CAST(:payload AS jsonb), :priority, :max_attempts, :created_by
    FROM mdm.aa_tenant t
    WHERE t.id = :tenant_id
      AND CAST(:kind AS text) = ANY(CAST(enum_range(NULL::mdm.job_kind) AS text[]))
    ON CONFLICT (tenant_id, name) DO NOTHING
    RETURNING id, name, tenant_id, schedule, job_kind::text AS kind, payload, priority,
              max_attempts, last_run, next_run, created_at, created_by, failing_since,
              last_error
), audited AS (
    INSERT INTO mdm.aa_cron_audit (cron_id, name, tenant_id, action, actor, detail)
    SELECT id, name, tenant_id, 'cron_create', COALESCE(created_by, 'unknown'),
           jsonb_build_object('schedule', schedule, 'kind', kind, 'payload', payload)
    FROM created
)
SELECT * FROM created;

-- name: cron_insert_diagnose
SELECT EXISTS (SELECT 1 FROM mdm.aa_tenant WHERE id = :tenant_id) AS tenant_exists,
       CAST(:kind AS text) = ANY(CAST(enum_range(NULL::mdm.job_kind) AS text[])) AS kind_exists,
       EXISTS (SELECT 1 FROM mdm.aa_cron_entry
               WHERE tenant_id = :tenant_id AND name = :name) AS name_taken;

-- name: cron_list
SELECT id, name, tenant_id, schedule, job_kind::text AS kind, payload, priority,
       max_attempts, last_run, next_run, created_at, created_by, failing_since, last_error
FROM mdm.aa_cron_entry
WHERE CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid)
ORDER BY name;

-- name: cron_tenants_named
-- Which tenants have an entry of this name: a delete by name alone must name one entry.
SELECT tenant_id FROM mdm.aa_cron_entry WHERE name = :name ORDER BY tenant_id;

-- name: cron_delete
-- The audit row keeps the whole deleted entry. Without :tenant_id (the service role, the
-- CLI) the name must be one tenant's only; the caller asks cron_tenants_named first for
-- its message, and the count here keeps a name another tenant took meanwhile from
-- deleting both (one statement, one snapshot).
WITH deleted AS (
    DELETE FROM mdm.aa_cron_entry
    WHERE name = :name
      AND (CASE WHEN CAST(:tenant_id AS uuid) IS NULL
                THEN (SELECT count(*) FROM mdm.aa_cron_entry c WHERE c.name = :name) = 1
                ELSE tenant_id = CAST(:tenant_id AS uuid) END)
    RETURNING *
), audited AS (
    INSERT INTO mdm.aa_cron_audit (cron_id, name, tenant_id, action, actor, detail)
    SELECT d.id, d.name, d.tenant_id, 'cron_delete', :actor, to_jsonb(d) FROM deleted d
)
SELECT id FROM deleted;

-- name: cron_schedule_all
-- What the scheduler needs to find due slots; cheap enough to read every tick. The time is
-- the database's: every worker reads the same clock, so one whose host clock runs ahead
-- cannot fire a slot early and hold it back from the others until its time comes.
SELECT id, name, tenant_id, schedule, created_at, last_run, statement_timestamp() AS now
FROM mdm.aa_cron_entry;

-- name: cron_claim_slot
-- Take one slot of one entry. The row lock makes a second scheduler wait here, then see
-- last_run = :slot and get no row, so a slot fires once however many workers run the
-- scheduler; the job's idempotency key (entry + slot) guards the same thing a second way.
-- A deleted entry yields no row and never fires again. A firing that succeeds (this
-- transaction commits with its job) ends a run of failures (cron_entry_failing); the
-- entry's failing_since before it, read under the same lock, tells the one scheduler whose
-- firing ended them to say so.
WITH entry AS (
    SELECT id, failing_since FROM mdm.aa_cron_entry WHERE id = :id FOR UPDATE
)
UPDATE mdm.aa_cron_entry e
SET last_run = :slot, next_run = :next_run, failing_since = NULL, last_error = NULL,
    failure_logged_at = NULL
FROM entry
WHERE e.id = entry.id AND (e.last_run IS NULL OR e.last_run < :slot)
RETURNING e.name, e.tenant_id, e.job_kind::text AS kind, e.payload, e.priority,
          e.max_attempts, entry.failing_since AS was_failing_since;

-- name: cron_entry_failing
-- A firing failed (its transaction rolled back, the slot still due): the entry shows since
-- when its firings fail and the latest reason, for `cron list`, the API and the dashboard.
-- Every worker fails the same slot every round, so this is also the claim of the line that
-- says it: a row comes back only to the one scheduler whose update is the line's, and it
-- alone logs. A line is due when the failures start (failing_since is null), when their
-- reason changes (the last line at or before :reason_before, at most every 10 s), and once
-- a minute while they go on (the last line at or before :still_before). The values before
-- the update, read under the row lock, say which line it is. An entry that fired since the
-- round read it (its last_run moved) is not failing any more: no row.
WITH entry AS (
    SELECT id, failing_since, last_error FROM mdm.aa_cron_entry
    WHERE id = :id AND last_run IS NOT DISTINCT FROM CAST(:last_run AS timestamptz)
    FOR UPDATE
)
UPDATE mdm.aa_cron_entry e
SET failing_since = COALESCE(e.failing_since, CAST(:at AS timestamptz)),
    last_error = :error,
    failure_logged_at = :at
FROM entry
WHERE e.id = entry.id
  AND e.last_run IS NOT DISTINCT FROM CAST(:last_run AS timestamptz)
  AND (e.failing_since IS NULL
       OR e.failure_logged_at IS NULL
       OR e.failure_logged_at <= :still_before
       OR (e.last_error IS DISTINCT FROM :error AND e.failure_logged_at <= :reason_before))
RETURNING e.failing_since, entry.failing_since AS was_failing_since,
          entry.last_error AS previous_error;
