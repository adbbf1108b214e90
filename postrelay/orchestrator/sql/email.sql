-- Statements of the email layer: aa_email_log and aa_email_suppression.

-- name: email_send_check_many
-- The one read before messages go out, for the attempts of several jobs at once (the
-- worker reads for the jobs of a claim together, or for the attempts that reach this point
-- together). For each job: its logged attempts, the attempts the rescuer took back from a
-- lost worker (its audit rows name the lost claim: they carry `claimed_by`), when an
-- operator last sent it back from the DLQ, and which of its recipients the tenant has
-- suppressed, in which categories ([category, address] pairs; '' is every category): an
-- attempt's own category is known only once its template is read, after this read may
-- have started. The record that a message may be on its way is the job's claim
-- (orchestrator/attempts.py says how a lost attempt becomes an `unknown` log row), which
-- commits without waiting for the disk. So this statement writes one WAL record (a
-- transactional logical message, prefix `postrelay`, which logical decoding consumers may
-- see and ignore): its commit waits for the WAL flush, and so for the claims of these
-- attempts, committed before it, before any of their messages leaves. A commit that wrote
-- nothing would not wait. It writes no row.
WITH r AS (
    SELECT CAST(d.row->>'job_id' AS uuid) AS job_id,
           CAST(d.row->>'tenant_id' AS uuid) AS tenant_id,
           ARRAY(SELECT jsonb_array_elements_text(d.row->'recipients')) AS recipients
    FROM jsonb_array_elements(CAST(:rows AS jsonb)) AS d(row)
), flush AS (
    SELECT pg_logical_emit_message(true, 'postrelay', 'send') AS lsn
)
-- A first attempt has no earlier rows: NULL, not '[]', which the driver would parse.
SELECT CAST(r.job_id AS text) AS job_id,
       (SELECT jsonb_agg(jsonb_build_object(
                   'id', l.id, 'attempt', l.attempt, 'status', l.status,
                   'created_at', l.created_at))
        FROM mdm.aa_email_log l WHERE l.job_id = r.job_id) AS logged,
       (SELECT jsonb_agg(jsonb_build_object(
                   'attempt', a.detail->'attempts', 'claimed_at', a.detail->'claimed_at',
                   'created_at', a.created_at))
        FROM mdm.aa_job_audit a
        WHERE a.job_id = r.job_id AND a.action IN ('job_rescued', 'job_dlq')
          AND a.detail ? 'claimed_by') AS lost,
       (SELECT max(a.created_at) FROM mdm.aa_job_audit a
        WHERE a.job_id = r.job_id AND a.action IN ('job_retry', 'job_requeue')) AS released_at,
       ARRAY(SELECT ARRAY[s.category, s.address] FROM mdm.aa_email_suppression s
             WHERE s.tenant_id = r.tenant_id AND s.address = ANY(r.recipients))
           AS suppressed,
       (SELECT lsn FROM flush) AS flushed_to
FROM r;

-- name: tenant_name
SELECT name FROM mdm.aa_tenant WHERE id = :tenant_id;

-- name: email_log_upsert_many
-- The outcomes of a batch of attempts, written with the jobs' completion (queue effects):
-- each attempt's one log row. A row is there already only when a later attempt logged
-- this one `unknown` (its worker was slow, not dead; both name the attempt by the same
-- id): the outcome replaces it.
WITH r AS (
    SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
        id uuid, tenant_id uuid, job_id uuid, event_id uuid, template text,
        template_version text, category text, from_address text, recipients text[],
        to_addresses text[], cc_addresses text[], bcc_addresses text[], subject text,
        message_id text, status text, smtp_code integer, smtp_enhanced text,
        smtp_response text, queue_id text, recipient_results jsonb, error text,
        attempt integer)
)
INSERT INTO mdm.aa_email_log AS l (
    id, tenant_id, job_id, event_id, template, template_version, category, from_address,
    recipients, to_addresses, cc_addresses, bcc_addresses, subject, message_id, status,
    smtp_code, smtp_enhanced, smtp_response, queue_id, recipient_results, error, attempt,
    finished_at)
SELECT r.id, r.tenant_id, r.job_id, r.event_id, r.template, r.template_version, r.category,
       r.from_address, r.recipients, r.to_addresses, r.cc_addresses, r.bcc_addresses,
       r.subject, r.message_id, r.status, r.smtp_code, r.smtp_enhanced, r.smtp_response,
       r.queue_id, r.recipient_results, r.error, r.attempt, now()
FROM r
ON CONFLICT (id) DO UPDATE
SET status = EXCLUDED.status,
    smtp_code = EXCLUDED.smtp_code,
    smtp_enhanced = EXCLUDED.smtp_enhanced,
    smtp_response = EXCLUDED.smtp_response,
    queue_id = EXCLUDED.queue_id,
    recipient_results = EXCLUDED.recipient_results,
    error = EXCLUDED.error,
    finished_at = now();

-- name: email_log_add_lost_many
-- `unknown` rows for attempts whose worker was lost (orchestrator/attempts.py), written with
-- the outcome of the attempt that found them. Each names its attempt by the id that
-- attempt gave its own row: if that outcome was written after all (the worker was slow,
-- not dead), it says more than `unknown`, and stays.
INSERT INTO mdm.aa_email_log (
    id, tenant_id, job_id, event_id, template, template_version, category, from_address,
    recipients, to_addresses, cc_addresses, bcc_addresses, subject, message_id, status,
    error, attempt, created_at, finished_at)
SELECT r.id, r.tenant_id, r.job_id, r.event_id, r.template, r.template_version, r.category,
       r.from_address, r.recipients, r.to_addresses, r.cc_addresses, r.bcc_addresses,
       r.subject, r.message_id, 'unknown', r.error, r.attempt, r.created_at, now()
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
    id uuid, tenant_id uuid, job_id uuid, event_id uuid, template text,
    template_version text, category text, from_address text, recipients text[],
    to_addresses text[], cc_addresses text[], bcc_addresses text[], subject text,
    message_id text, error text, attempt integer, created_at timestamptz)
ON CONFLICT (id) DO NOTHING;

-- name: email_suppression_add_many
-- An address the server said does not exist (5.1.x) is not tried again for this tenant.
INSERT INTO mdm.aa_email_suppression (tenant_id, address, reason, smtp_code, smtp_enhanced,
                                      email_log_id, source)
SELECT r.tenant_id, r.address, r.reason, r.smtp_code, r.smtp_enhanced, r.email_log_id, 'smtp'
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
    tenant_id uuid, address text, reason text, smtp_code integer, smtp_enhanced text,
    email_log_id uuid)
ON CONFLICT (tenant_id, address, category) DO NOTHING;

-- name: email_suppression_list
SELECT tenant_id, address, category, reason, source, smtp_code, smtp_enhanced, email_log_id,
       feedback_id, created_at
FROM mdm.aa_email_suppression
WHERE (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
  AND (CAST(:address AS text) IS NULL OR address = CAST(:address AS text))
ORDER BY created_at DESC, address
LIMIT :limit;

-- name: email_log_list
-- The log, newest first, narrowed by tenant, status, recipient, event or job (and the
-- rest). A status matches the SMTP outcome or what feedback said later (a late bounce): ix_email_log_tenant_time, ix_email_log_status_time, the recipients' GIN index,
-- ix_email_log_event or ix_email_log_job.
SELECT l.id, l.tenant_id, l.job_id, l.event_id, l.template, l.template_version, l.category,
       l.from_address, l.recipients, l.to_addresses, l.cc_addresses, l.bcc_addresses,
       l.subject, l.message_id, l.status, l.smtp_code, l.smtp_enhanced, l.smtp_response,
       l.queue_id, l.error, l.attempt, l.created_at, l.finished_at, l.delivery, l.delivery_at
FROM mdm.aa_email_log l
WHERE (CAST(:tenant_id AS uuid) IS NULL OR l.tenant_id = CAST(:tenant_id AS uuid))
  AND (CAST(:status AS text) IS NULL OR l.status = CAST(:status AS text)
       OR l.delivery = CAST(:status AS text))
  AND (CAST(:recipient AS text) IS NULL OR l.recipients @> ARRAY[CAST(:recipient AS text)])
  AND (CAST(:event_id AS uuid) IS NULL OR l.event_id = CAST(:event_id AS uuid))
  AND (CAST(:job_id AS uuid) IS NULL OR l.job_id = CAST(:job_id AS uuid))
  AND (CAST(:template AS text) IS NULL OR l.template = CAST(:template AS text))
  AND (CAST(:since AS timestamptz) IS NULL OR l.created_at >= CAST(:since AS timestamptz))
  AND (CAST(:until AS timestamptz) IS NULL OR l.created_at < CAST(:until AS timestamptz))
ORDER BY l.created_at DESC, l.id DESC
LIMIT :limit OFFSET :offset;

-- name: email_log_list_status
-- The log in one status, newest first, when no recipient, event or job narrows it further.
-- A status matches the SMTP outcome or what feedback said later, and `status = x OR
-- delivery = x` made PostgreSQL fetch every such row from the heap and sort them (about a
-- second for the 1 % bounced of 10 million rows). Two backward ranges instead, one of
-- ix_email_log_status_time and one of ix_email_log_delivery_time, each stopping after a
-- page, merged; a row in both (sent, then bounced late) comes from the first only.
SELECT l.*
FROM (
    (SELECT l.id, l.tenant_id, l.job_id, l.event_id, l.template, l.template_version,
           l.category, l.from_address, l.recipients, l.to_addresses, l.cc_addresses,
           l.bcc_addresses, l.subject, l.message_id, l.status, l.smtp_code, l.smtp_enhanced,
           l.smtp_response, l.queue_id, l.error, l.attempt, l.created_at, l.finished_at,
           l.delivery, l.delivery_at
    FROM mdm.aa_email_log l
    WHERE l.status = CAST(:status AS text)
      AND (CAST(:tenant_id AS uuid) IS NULL OR l.tenant_id = CAST(:tenant_id AS uuid))
      AND (CAST(:template AS text) IS NULL OR l.template = CAST(:template AS text))
      AND (CAST(:since AS timestamptz) IS NULL OR l.created_at >= CAST(:since AS timestamptz))
      AND (CAST(:until AS timestamptz) IS NULL OR l.created_at < CAST(:until AS timestamptz))
    ORDER BY l.created_at DESC, l.id DESC
    LIMIT CAST(:limit AS integer) + CAST(:offset AS integer))
    UNION ALL
    (SELECT l.id, l.tenant_id, l.job_id, l.event_id, l.template, l.template_version,
           l.category, l.from_address, l.recipients, l.to_addresses, l.cc_addresses,
           l.bcc_addresses, l.subject, l.message_id, l.status, l.smtp_code, l.smtp_enhanced,
           l.smtp_response, l.queue_id, l.error, l.attempt, l.created_at, l.finished_at,
           l.delivery, l.delivery_at
    FROM mdm.aa_email_log l
    WHERE l.delivery = CAST(:status AS text) AND l.status <> CAST(:status AS text)
      AND (CAST(:tenant_id AS uuid) IS NULL OR l.tenant_id = CAST(:tenant_id AS uuid))
      AND (CAST(:template AS text) IS NULL OR l.template = CAST(:template AS text))
      AND (CAST(:since AS timestamptz) IS NULL OR l.created_at >= CAST(:since AS timestamptz))
      AND (CAST(:until AS timestamptz) IS NULL OR l.created_at < CAST(:until AS timestamptz))
    ORDER BY l.created_at DESC, l.id DESC
    LIMIT CAST(:limit AS integer) + CAST(:offset AS integer))
) l
ORDER BY l.created_at DESC, l.id DESC
LIMIT :limit OFFSET :offset;

-- name: email_log_list_recent
-- The same without any of those filters: no index orders the whole log by time, so the
-- newest rows are merged from each tenant's range of ix_email_log_tenant_time (one short
-- backward index scan per tenant) instead of sorting the log. The tenants are those the
-- log holds, read from the same index one after another (a loose index scan, as
-- email_log_delete_before reads them): the log keeps the rows of a tenant deleted since,
-- and every other list shows them.
WITH RECURSIVE tenants AS (
    (SELECT tenant_id FROM mdm.aa_email_log ORDER BY tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT l.tenant_id FROM mdm.aa_email_log l
            WHERE l.tenant_id > t.tenant_id ORDER BY l.tenant_id LIMIT 1)
    FROM tenants t
    WHERE t.tenant_id IS NOT NULL
)
SELECT l.id, l.tenant_id, l.job_id, l.event_id, l.template, l.template_version, l.category,
       l.from_address, l.recipients, l.to_addresses, l.cc_addresses, l.bcc_addresses,
       l.subject, l.message_id, l.status, l.smtp_code, l.smtp_enhanced, l.smtp_response,
       l.queue_id, l.error, l.attempt, l.created_at, l.finished_at, l.delivery, l.delivery_at
FROM tenants t
CROSS JOIN LATERAL (
    SELECT *
    FROM mdm.aa_email_log e
    WHERE e.tenant_id = t.tenant_id
      AND (CAST(:template AS text) IS NULL OR e.template = CAST(:template AS text))
      AND (CAST(:since AS timestamptz) IS NULL OR e.created_at >= CAST(:since AS timestamptz))
      AND (CAST(:until AS timestamptz) IS NULL OR e.created_at < CAST(:until AS timestamptz))
    ORDER BY e.created_at DESC, e.id DESC
    LIMIT :limit + :offset
) l
ORDER BY l.created_at DESC, l.id DESC
LIMIT :limit OFFSET :offset;

-- name: email_story
-- One message's whole story in one statement: the log row, every attempt's row for the
-- same message (the job's attempts: its Message-ID is the job's), the job with its audit trail, the outbox
-- event it came from, and the feedback that arrived about it. A tenant sees only its own
-- rows; and whoever asks, every table joined is held to the log row's tenant: the event id
-- is copied from the job's payload, so it is only as good as the code that wrote the
-- payload, and another tenant's event (or job, or audit row) must never be shown beside
-- this tenant's message.
WITH target AS (
    SELECT * FROM mdm.aa_email_log
    WHERE id = CAST(:log_id AS uuid)
      AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
)
SELECT to_jsonb(t) AS log,
       (SELECT COALESCE(jsonb_agg(to_jsonb(a) ORDER BY a.attempt, a.created_at), '[]')
        FROM mdm.aa_email_log a
        WHERE (a.job_id = t.job_id AND a.message_id = t.message_id OR a.id = t.id)
          AND a.tenant_id = t.tenant_id) AS attempts,
       (SELECT jsonb_build_object(
                   'id', j.id, 'kind', j.job_kind, 'status', j.status,
                   'attempts', j.attempts, 'max_attempts', j.max_attempts,
                   'priority', j.priority, 'last_error', j.last_error,
                   'created_at', j.created_at, 'available_at', j.available_at,
                   'claimed_at', j.claimed_at, 'claimed_by', j.claimed_by,
                   'completed_at', j.completed_at, 'idempotency_key', j.idempotency_key)
        FROM mdm.aa_job j WHERE j.id = t.job_id AND j.tenant_id = t.tenant_id) AS job,
       (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                   'action', u.action, 'actor', u.actor, 'detail', u.detail,
                   'created_at', u.created_at) ORDER BY u.id), '[]')
        FROM mdm.aa_job_audit u
        WHERE u.job_id = t.job_id AND u.tenant_id = t.tenant_id) AS audit,
       (SELECT jsonb_build_object(
                   'id', e.id, 'event_type', e.event_type, 'aggregate_type', e.aggregate_type,
                   'aggregate_id', e.aggregate_id,
                   'created_at', e.created_at, 'handled_at', e.handled_at)
        FROM mdm.aa_outbox_event e
        WHERE e.id = t.event_id AND e.tenant_id = t.tenant_id) AS event,
       -- The payloads and headers as columns of their own: one nested too deep to show
       -- (SQL written by hand) is read as a placeholder (jsontext.read_listed) without
       -- the job's or the event's other fields.
       (SELECT j.payload FROM mdm.aa_job j
        WHERE j.id = t.job_id AND j.tenant_id = t.tenant_id) AS job_payload,
       (SELECT e.payload FROM mdm.aa_outbox_event e
        WHERE e.id = t.event_id AND e.tenant_id = t.tenant_id) AS event_payload,
       (SELECT e.headers FROM mdm.aa_outbox_event e
        WHERE e.id = t.event_id AND e.tenant_id = t.tenant_id) AS event_headers,
       (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                   'id', f.id, 'email_log_id', f.email_log_id, 'recipient', f.recipient,
                   'kind', f.kind, 'status', f.status, 'diagnostic', f.diagnostic,
                   'source', f.source,
                   'suppressed', f.suppressed OR made.feedback_id IS NOT NULL,
                   'received_at', f.received_at) ORDER BY f.received_at, f.id), '[]')
        FROM mdm.aa_email_feedback f
        JOIN mdm.aa_email_log a ON a.id = f.email_log_id
        -- Whether the report suppressed: as in email_feedback_list (feedback.sql).
        LEFT JOIN LATERAL (SELECT s.feedback_id FROM mdm.aa_email_suppression s
                           WHERE s.feedback_id = f.id LIMIT 1) made ON true
        WHERE (a.job_id = t.job_id AND a.message_id = t.message_id OR a.id = t.id)
          AND a.tenant_id = t.tenant_id) AS feedback
FROM target t;

-- name: email_log_delete_before
-- Retention of the email log (POSTRELAY_EMAIL_LOG_RETENTION_DAYS; kept when unset): one
-- bounded batch of rows created before :before, oldest first within each tenant, found by
-- ix_email_log_tenant_time one tenant after another (a tenant with nothing that old costs
-- one index probe), so no index is added for it. The tenants are those the log holds,
-- read from the same index one after another (a loose index scan): the log keeps the rows
-- of a tenant deleted since, and they age out too. Nothing references the log, so the
-- delete touches this table alone. An `unknown` row stays while its job may still run
-- (pending, running, or held in the DLQ until an operator acts): the next attempt reads it
-- to follow the template's on_unknown policy, and feedback proving the message left
-- resolves it and completes the held job (email_feedback_apply_many). Without it, such
-- feedback matched nothing, the job stayed held and a retry sent the message again, and a
-- pending job's next attempt sent it despite `hold`. Such rows are few, and go once their
-- job is done or deleted.
WITH RECURSIVE tenants AS (
    (SELECT tenant_id FROM mdm.aa_email_log ORDER BY tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT l.tenant_id FROM mdm.aa_email_log l
            WHERE l.tenant_id > t.tenant_id ORDER BY l.tenant_id LIMIT 1)
    FROM tenants t
    WHERE t.tenant_id IS NOT NULL
), doomed AS (
    SELECT l.id
    FROM tenants t
    CROSS JOIN LATERAL (
        SELECT g.id FROM mdm.aa_email_log g
        WHERE g.tenant_id = t.tenant_id AND g.created_at < CAST(:before AS timestamptz)
          AND NOT (g.status = 'unknown' AND EXISTS (
                   SELECT 1 FROM mdm.aa_job j
                   WHERE j.id = g.job_id AND j.status IN ('pending', 'running', 'dlq')))
        ORDER BY g.created_at
        LIMIT :batch
    ) l
    LIMIT :batch
)
DELETE FROM mdm.aa_email_log e USING doomed WHERE e.id = doomed.id;

-- name: email_log_cancelled
-- An email_send job cancelled before it ran leaves a log row of status `cancelled`, so
-- that "what happened to the mail to X" has an answer: never sent, and who cancelled it
-- (the job's last_error). Its addresses are the payload's as written; no message was made,
-- so there is no Message-ID (empty). Jobs cancelled while running are left to the row
-- their attempt wrote. The payload's event_id is kept only when it has a UUID's shape (32
-- hex digits, hyphens between groups of four), which the cast to uuid always accepts: the
-- payload is not checked before the worker reads it, and a cast that failed would abort
-- the cancel.
INSERT INTO mdm.aa_email_log (
    tenant_id, job_id, event_id, template, category, from_address, recipients,
    to_addresses, cc_addresses, bcc_addresses, message_id, status, error, attempt,
    finished_at)
SELECT j.tenant_id, j.id,
       CASE WHEN j.payload->>'event_id' ~* '^[0-9a-f]{8}-?([0-9a-f]{4}-?){3}[0-9a-f]{12}$'
            THEN CAST(j.payload->>'event_id' AS uuid) END,
       coalesce(j.payload->>'template', ''), j.payload->>'category',
       coalesce(j.payload->>'from', ''),
       ARRAY(SELECT lower(a) FROM unnest(a.to_ || a.cc || a.bcc) AS a),
       a.to_, a.cc, a.bcc, '', 'cancelled', j.last_error, j.attempts, now()
FROM mdm.aa_job j
CROSS JOIN LATERAL (
    SELECT ARRAY(SELECT jsonb_array_elements_text(CASE jsonb_typeof(j.payload->'to')
                 WHEN 'array' THEN j.payload->'to' WHEN 'string' THEN jsonb_build_array(j.payload->'to')
                 ELSE '[]' END)) AS to_,
           ARRAY(SELECT jsonb_array_elements_text(CASE jsonb_typeof(j.payload->'cc')
                 WHEN 'array' THEN j.payload->'cc' WHEN 'string' THEN jsonb_build_array(j.payload->'cc')
                 ELSE '[]' END)) AS cc,
           ARRAY(SELECT jsonb_array_elements_text(CASE jsonb_typeof(j.payload->'bcc')
                 WHEN 'array' THEN j.payload->'bcc' WHEN 'string' THEN jsonb_build_array(j.payload->'bcc')
                 ELSE '[]' END)) AS bcc
) a
WHERE j.id = ANY(CAST(:ids AS uuid[]))
  AND j.job_kind = 'email_send';

-- The email hour tally (orchestrator/email_hours.py): log rows per closed hour, tenant and
-- status, tallied once by the maintenance leader, so that the week of the bounce and
-- complaint rates sums a few rows per tenant and hour instead of counting every log row.
-- Hours are UTC hours, whatever the session's time zone.

-- name: email_hour_rollup_mark
-- Locks the tally's mark for the round (creating it on the first), and returns it with the
-- round's cutoff: the start of the hour `margin_secs` ago. A log row's created_at is its
-- attempt's start and the row commits when the attempt ends, so an hour is tallied only
-- once it ended more than the margin ago. A second leader racing this one waits here and
-- then reads the mark the first one moved. A leader stalled inside the round lets the lock
-- go after 5 s idle, as in job_done_rollup_mark (queue/sql/rollup.sql).
INSERT INTO mdm.aa_email_hour_rollup (id) VALUES (true)
ON CONFLICT (id) DO UPDATE SET until = mdm.aa_email_hour_rollup.until
RETURNING until,
          date_trunc('hour', COALESCE(CAST(:now AS timestamptz), now())
                             - make_interval(secs => CAST(:margin_secs AS float8)),
                     'UTC') AS cutoff,
          set_config('idle_in_transaction_session_timeout', '5s', true) AS stall_limit;

-- name: email_hour_rollup_tally
-- Tallies the log rows created in [start, end), whole hours, through ix_email_log_status_time
-- (one range per status), and moves the mark to `end` in the same transaction. Rows of a
-- tenant that no longer exists are left out (the log has no foreign key; the tally has). An
-- hour tallied again (the mark cleared by hand) gets its new counts, never the sum of both.
WITH tally AS (
    INSERT INTO mdm.aa_email_hour (hour, tenant_id, status, messages)
    SELECT date_trunc('hour', l.created_at, 'UTC'), l.tenant_id, l.status, count(*)
    FROM mdm.aa_email_log l
    JOIN mdm.aa_tenant t ON t.id = l.tenant_id
    WHERE l.status = ANY(CAST(:statuses AS text[]))
      AND l.created_at >= CAST(:start AS timestamptz)
      AND l.created_at < CAST(:end AS timestamptz)
    GROUP BY 1, 2, 3
    ON CONFLICT (hour, tenant_id, status) DO UPDATE SET messages = EXCLUDED.messages
    RETURNING messages
), marked AS (
    UPDATE mdm.aa_email_hour_rollup SET until = CAST(:end AS timestamptz)
)
SELECT CAST(COALESCE(sum(messages), 0) AS bigint) AS messages FROM tally;

-- name: email_hour_delete_before
-- The tally's retention: a few rows per tenant and hour, by the primary key.
DELETE FROM mdm.aa_email_hour WHERE hour < CAST(:before AS timestamptz);

-- name: email_hour_rollup_until
-- The tally's mark: every hour before it is in aa_email_hour (NULL: none yet). Read apart
-- from the rates so that they are planned with it as a constant.
SELECT (SELECT until FROM mdm.aa_email_hour_rollup) AS until;

-- name: email_event_contexts
-- The events whose payloads are the template context of messages that share them (a split
-- or bulk route's: `context_from_event`), each read only for its own tenant. `size` (the
-- payload's JSON text, not its compressed storage) bounds the worker's cache of them.
SELECT e.id, e.tenant_id, e.aggregate_type, e.aggregate_id, e.event_type, e.payload,
       e.created_at, octet_length(CAST(e.payload AS text)) AS size
FROM unnest(CAST(:tenant_ids AS uuid[]), CAST(:event_ids AS uuid[])) AS k(tenant_id, event_id)
JOIN mdm.aa_outbox_event e ON e.id = k.event_id AND e.tenant_id = k.tenant_id;
