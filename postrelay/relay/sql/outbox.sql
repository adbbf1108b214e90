-- The transactional outbox: emit in the caller's transaction, relay in batches.

-- name: outbox_insert
-- Selecting from aa_tenant turns an unknown tenant into "no row" instead of a foreign-key
-- error that would abort the caller's transaction. The id is made by the caller and
-- success read from the row count, sparing the round trip a RETURNING row. The relay's
-- wake-up rides along when `notify` asks for it, once per transaction.
WITH wake AS MATERIALIZED (
    SELECT CASE WHEN CAST(:notify AS boolean) THEN pg_notify('postrelay_outbox', '') END
)
INSERT INTO mdm.aa_outbox_event
    (id, tenant_id, aggregate_type, aggregate_id, event_type, payload, headers, created_by)
SELECT :id, t.id, :aggregate_type, :aggregate_id, :event_type, CAST(:payload AS jsonb),
       CAST(:headers AS jsonb), :created_by
FROM mdm.aa_tenant t CROSS JOIN wake
WHERE t.id = :tenant_id;

-- name: outbox_claim_batch
-- Unhandled events, oldest first. Claiming by "not handled yet" rather than by a position
-- means an event whose transaction commits late is still relayed when it becomes visible;
-- SKIP LOCKED lets several relays share the backlog without waiting on each other.
-- Payload and headers come as JSON text, headers NULL when empty (the usual case): the
-- relay decodes them for half what psycopg's jsonb loader costs per document.
-- created_at past Python's years (SQL by hand: 'infinity', '-infinity', the year 12000)
-- has no datetime, and failed every batch that claimed it: it is read as the latest or
-- earliest one, as the listings read it (core/timestamps.py).
SELECT id, tenant_id, aggregate_type, aggregate_id, event_type,
       CAST(payload AS text) AS payload, CAST(NULLIF(headers, '{}') AS text) AS headers,
       LEAST(GREATEST(created_at, TIMESTAMPTZ '0001-01-01 00:00:00+00'),
             TIMESTAMPTZ '9999-12-31 23:59:59.999999+00') AS created_at,
       attempts, seq
FROM mdm.aa_outbox_event
WHERE handled_at IS NULL AND dead_at IS NULL AND available_at <= now()
ORDER BY seq
LIMIT :batch
FOR UPDATE SKIP LOCKED;

-- name: outbox_blocked_aggregates
-- Of the given events' aggregates, those that must wait: an ordered job of an earlier event
-- is not finished yet, or an earlier live event of the aggregate is still unrelayed (it
-- goes first). Finished means done, failed or dlq: a dead job does not stall its aggregate.
SELECT DISTINCT b.tenant_id, b.aggregate_type, b.aggregate_id
FROM unnest(CAST(:event_ids AS uuid[]), CAST(:tenant_ids AS uuid[]),
            CAST(:aggregate_types AS text[]), CAST(:aggregate_ids AS text[]),
            CAST(:seqs AS bigint[]))
     AS b(event_id, tenant_id, aggregate_type, aggregate_id, seq)
WHERE EXISTS (
        SELECT 1
        FROM mdm.aa_outbox_event e
        JOIN mdm.aa_outbox_delivery d ON d.event_id = e.id AND d.ordered
        JOIN mdm.aa_job j ON j.id = d.job_id
        WHERE e.tenant_id = b.tenant_id AND e.aggregate_type = b.aggregate_type
          AND e.aggregate_id = b.aggregate_id AND e.seq < b.seq
          AND j.status IN ('pending', 'running'))
   OR EXISTS (
        SELECT 1 FROM mdm.aa_outbox_event e
        WHERE e.tenant_id = b.tenant_id AND e.aggregate_type = b.aggregate_type
          AND e.aggregate_id = b.aggregate_id AND e.seq < b.seq
          AND e.handled_at IS NULL AND e.dead_at IS NULL
          AND e.id <> ALL(CAST(:event_ids AS uuid[])));

-- name: outbox_defer_many
-- Ordered events whose aggregate is busy wait a little; no attempt is counted.
UPDATE mdm.aa_outbox_event
SET available_at = now() + make_interval(secs => :delay)
WHERE id = ANY(CAST(:ids AS uuid[]));

-- name: outbox_server_plans
-- Each job row's foreign-key check is a cached plan of the server's own, planned afresh for
-- every row under the relay engine's custom plans (runtime.build_relay): the jobs are
-- copied in with the server's default, and outbox_custom_plans restores the engine's (kept
-- aside in a setting of ours).
SELECT set_config('postrelay.plan_cache_mode', current_setting('plan_cache_mode'), true),
       set_config('plan_cache_mode', 'auto', true);

-- name: outbox_custom_plans
SELECT set_config('plan_cache_mode', current_setting('postrelay.plan_cache_mode'), true);

-- name: outbox_link_many
-- Link each (event, route) to the job the relay is about to make for it, before making it:
-- the link's uniqueness is what keeps a replayed event from making a second job (the
-- relay's idempotency keys are not in job_idempotency_uk: queue/sql/job.sql). A link that
-- exists keeps its job, unless retention has deleted that job, or it is a webhook delivery
-- that stopped unsent (outbox_dispatch, `failed`: its endpoint was disabled, removed or
-- gone when it ran): then the link takes the new one, so that a replay after `webhooks
-- enable` delivers what the endpoint missed. Conflicts come only from replays: a first
-- relay of an event pays nothing for this. Returns the ids of the jobs to make: those
-- whose link is new or was taken over.
WITH linked AS (
    INSERT INTO mdm.aa_outbox_delivery AS d (event_id, route, job_id, ordered)
    SELECT * FROM unnest(CAST(:event_ids AS uuid[]), CAST(:routes AS text[]),
                         CAST(:job_ids AS uuid[]), CAST(:ordered AS boolean[]))
    ON CONFLICT (event_id, route) DO UPDATE
        SET job_id = EXCLUDED.job_id, ordered = EXCLUDED.ordered
        WHERE NOT EXISTS (
            SELECT FROM mdm.aa_job j
            WHERE j.id = d.job_id
              AND NOT (j.job_kind = 'outbox_dispatch' AND j.status = 'failed'))
    RETURNING d.job_id
)
SELECT ARRAY(SELECT job_id FROM linked) AS job_ids;

-- name: outbox_mark_handled_many
-- Mark the batch's events handled, with how many jobs their routes asked for.
UPDATE mdm.aa_outbox_event e
SET handled_at = clock_timestamp(), jobs_created = h.jobs, last_error = NULL
FROM unnest(CAST(:ids AS uuid[]), CAST(:jobs AS integer[])) AS h(id, jobs)
-- The = ANY finds the batch's rows by primary key: joined on e.id = h.id alone, the
-- planner hashes the whole outbox, a scan that grows with the backlog.
WHERE e.id = ANY(CAST(:ids AS uuid[])) AND e.id = h.id;

-- name: outbox_mark_failed_many
-- Routing raised: record the error, back off, and after :max_attempts park the event as
-- dead (visible in `postrelay outbox status`) so it never blocks the events behind it.
UPDATE mdm.aa_outbox_event e
SET attempts = e.attempts + 1,
    last_error = f.error,
    available_at = now() + make_interval(secs => f.delay),
    dead_at = CASE WHEN e.attempts + 1 >= CAST(:max_attempts AS integer) THEN now() END
FROM unnest(CAST(:ids AS uuid[]), CAST(:errors AS text[]), CAST(:delays AS float8[]))
     AS f(id, error, delay)
-- As in outbox_mark_handled_many: the = ANY keeps a batch whose every event failed from
-- hashing the whole outbox.
WHERE e.id = ANY(CAST(:ids AS uuid[])) AND e.id = f.id
RETURNING e.id, e.dead_at IS NOT NULL AS dead;

-- name: outbox_status
-- An event created at ±infinity (written by hand) is counted, not aged: `now() - infinity`
-- is an error, which failed /metrics and `outbox status` as a whole (as job_pending_due).
SELECT count(*) FILTER (WHERE handled_at IS NULL AND dead_at IS NULL) AS backlog,
       EXTRACT(EPOCH FROM now() - min(created_at)
               FILTER (WHERE handled_at IS NULL AND dead_at IS NULL
                         AND isfinite(created_at)))::float8 AS lag_secs,
       count(*) FILTER (WHERE dead_at IS NOT NULL) AS dead,
       count(*) FILTER (WHERE handled_at IS NOT NULL) AS handled,
       count(*) FILTER (WHERE attempts > 0 AND handled_at IS NULL AND dead_at IS NULL)
           AS retrying
FROM mdm.aa_outbox_event
WHERE CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid);

-- name: outbox_dead_list
SELECT id, tenant_id, event_type, aggregate_type, aggregate_id, attempts, last_error,
       created_at, dead_at
FROM mdm.aa_outbox_event
WHERE dead_at IS NOT NULL
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
ORDER BY dead_at DESC
LIMIT :limit;

-- name: outbox_jobs_of_event
-- Follow one event to every job it produced. The links have no tenant column: a link to a
-- job of another tenant than the event's (:tenant_id, read by the caller within its
-- scope) is left out; a link whose job retention has deleted stays, without kind or status.
SELECT d.route, d.job_id, j.job_kind::text AS kind, j.status::text AS status, j.attempts
FROM mdm.aa_outbox_delivery d
LEFT JOIN mdm.aa_job j ON j.id = d.job_id
WHERE d.event_id = :event_id
  AND (j.id IS NULL OR j.tenant_id = CAST(:tenant_id AS uuid))
ORDER BY d.route;

-- name: outbox_copy_in
-- A batch of events streams in with binary COPY, in order (`seq` follows it), about twice as
-- fast as an INSERT of the same rows; the tenants are checked first by the caller. The
-- column types are OUTBOX_COPY_TYPES in emit.py: keep the two in step.
COPY mdm.aa_outbox_event (id, tenant_id, aggregate_type, aggregate_id, event_type, payload,
                          headers, created_by)
FROM STDIN (FORMAT BINARY)

-- name: outbox_insert_many
-- A small batch of events in one statement, in order (`seq` follows it): below
-- COPY_MIN_EVENTS a COPY's own setup and extra round trips (the tenant check before it,
-- the copy's start and end) cost more than it saves. All or nothing: when a tenant does not
-- exist, no event is inserted and the unknown tenants come back (NULL when all exist). The
-- relays' wake-up rides along when wanted. The events come as one jsonb array of rows
-- (cheaper for the client to write than an array parameter per column; payload and
-- headers as their JSON text), read through unnest(ARRAY(...)) so that a generic plan
-- counts on a few rows, as unnest over arrays made it.
WITH w AS (
    SELECT r.*, e.n
    FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb))))
         WITH ORDINALITY AS e(doc, n),
         jsonb_to_record(e.doc) AS r(id uuid, tenant_id uuid, aggregate_type text,
                                     aggregate_id text, event_type text, payload text,
                                     headers text)
), missing AS MATERIALIZED (
    SELECT array_agg(DISTINCT w.tenant_id) AS tenants
    FROM w
    WHERE NOT EXISTS (SELECT 1 FROM mdm.aa_tenant t WHERE t.id = w.tenant_id)
), wake AS MATERIALIZED (
    SELECT CASE WHEN CAST(:notify AS boolean) THEN pg_notify('postrelay_outbox', '') END
    FROM missing
    WHERE missing.tenants IS NULL
), inserted AS (
    INSERT INTO mdm.aa_outbox_event
        (id, tenant_id, aggregate_type, aggregate_id, event_type, payload, headers,
         created_by)
    SELECT w.id, w.tenant_id, w.aggregate_type, w.aggregate_id, w.event_type,
           CAST(w.payload AS jsonb), CAST(w.headers AS jsonb), CAST(:created_by AS text)
    FROM w CROSS JOIN wake
    ORDER BY w.n
)
SELECT tenants AS missing FROM missing;

-- name: outbox_batch_check
-- Before a batch of events: which tenants do not exist (nothing is written if any). The
-- wake-up for the relays rides along when wanted, sparing a round trip; it is only a hint,
-- delivered if the caller commits.
SELECT ARRAY(SELECT t FROM unnest(CAST(:tenant_ids AS uuid[])) AS t
             WHERE NOT EXISTS (SELECT 1 FROM mdm.aa_tenant a WHERE a.id = t)) AS missing,
       CASE WHEN CAST(:notify AS boolean) THEN pg_notify('postrelay_outbox', '') END AS notified;

-- name: outbox_delete_handled_before
-- Retention: one bounded batch of handled events and their delivery links (the links
-- have no foreign key to cascade from). Unhandled and dead events are never touched, nor
-- an event with a job still to run of a kind in :readers, whose jobs read their event when
-- they run (a webhook delivery does, and so does a message of a split email route, whose
-- context is the event's payload), and would find it gone; nor one with an ordered job
-- still to run, which holds its aggregate's later events back (outbox_blocked_aggregates
-- reads the event and its link: without them the next event's job was made at once). A
-- dead-lettered job does not keep its event (the DLQ is kept until discarded: its events
-- would pile up at the head of every batch; nor does it stall its aggregate).
WITH doomed AS (
    SELECT e.id FROM mdm.aa_outbox_event e
    WHERE e.handled_at < CAST(:before AS timestamptz)
      AND NOT EXISTS (
          SELECT 1 FROM mdm.aa_outbox_delivery d JOIN mdm.aa_job j ON j.id = d.job_id
          WHERE d.event_id = e.id
            AND (d.ordered OR CAST(j.job_kind AS text) = ANY (CAST(:readers AS text[])))
            AND j.status IN ('pending', 'running'))
    ORDER BY e.handled_at
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
), unlinked AS (
    DELETE FROM mdm.aa_outbox_delivery d USING doomed WHERE d.event_id = doomed.id
)
DELETE FROM mdm.aa_outbox_event e USING doomed WHERE e.id = doomed.id;

-- name: outbox_replay
-- Hand events back to the relay. Their delivery links make the relay create no second
-- copy of a job that still exists (outbox_link_many). `dead`: only the events the relay
-- gave up on. Keep the filter as outbox_replay_count's, which counts it before a replay.
UPDATE mdm.aa_outbox_event
SET handled_at = NULL, dead_at = NULL, attempts = 0, available_at = now(), last_error = NULL
WHERE (CAST(:event_id AS uuid) IS NULL OR id = CAST(:event_id AS uuid))
  AND (CAST(:since AS timestamptz) IS NULL OR created_at >= CAST(:since AS timestamptz))
  AND (CAST(:until AS timestamptz) IS NULL OR created_at < CAST(:until AS timestamptz))
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
  AND (NOT CAST(:dead AS boolean) OR dead_at IS NOT NULL)
RETURNING id;

-- name: outbox_replay_count
-- How many events outbox_replay would hand back, with the same filter: what the CLI shows
-- before it asks to replay them.
SELECT count(*)
FROM mdm.aa_outbox_event
WHERE (CAST(:event_id AS uuid) IS NULL OR id = CAST(:event_id AS uuid))
  AND (CAST(:since AS timestamptz) IS NULL OR created_at >= CAST(:since AS timestamptz))
  AND (CAST(:until AS timestamptz) IS NULL OR created_at < CAST(:until AS timestamptz))
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
  AND (NOT CAST(:dead AS boolean) OR dead_at IS NOT NULL);

-- name: outbox_event_get
-- One event with its relay bookkeeping; another tenant's event is no row, like a missing one.
SELECT id, tenant_id, aggregate_type, aggregate_id, event_type, payload, headers,
       created_at, created_by, seq, handled_at, jobs_created, attempts, available_at,
       last_error, dead_at
FROM mdm.aa_outbox_event
WHERE id = CAST(:event_id AS uuid)
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid));
