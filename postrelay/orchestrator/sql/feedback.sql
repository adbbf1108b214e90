-- Statements of delivery feedback: aa_email_feedback, and its effects on aa_email_log,
-- aa_email_suppression and a held email_send job.

-- name: email_feedback_match_many
-- The log row each piece of feedback of a batch is about (one row per report, in the
-- order given; NULLs where nothing matched), by the strongest key it carries: the VERP
-- token's log row (verified before it gets here), the Message-ID postrelay generated (the
-- same on every attempt of a job: the attempt that went out is preferred, the latest of
-- them), or the relay's queue id from its 250 reply (not unique across relays and time:
-- the latest row with that id sent to the recipient, or to the alias forwarded to it).
-- Each weaker key is looked up only when the stronger ones found nothing (its condition on
-- them is checked once per report, before any scan): a DSN to its VERP address costs one
-- index probe. One statement for a batch: a provider's hundred events cost one round trip
-- here, not a hundred. The batch comes as one jsonb array of rows (`jsontext.encode_rows`),
-- as do those of the insert and the apply: cheaper for the client to write than an array
-- parameter per column. It is read through unnest(ARRAY(...)) so that a generic plan counts
-- on 10 rows, as it did for unnest over array parameters (jsonb_to_recordset's 100 made
-- them scan the log).
-- `tenant_gone`: the tenant the report would be recorded under (its log row's, else the
-- one it names) has been deleted since; the log keeps its rows.
SELECT w.n, m.id, m.tenant_id, m.job_id, m.status, m.recipients, m.category, m.template,
       m.message_id,
       CASE WHEN v.id IS NOT NULL THEN 'verp'
            WHEN by_message.id IS NOT NULL THEN 'message_id'
            WHEN by_queue.id IS NOT NULL THEN 'queue_id' END AS matched_by,
       COALESCE(m.tenant_id, w.tenant_id) IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM mdm.aa_tenant t
                       WHERE t.id = COALESCE(m.tenant_id, w.tenant_id)) AS tenant_gone
FROM (SELECT r.*, e.n
      FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb))))
           WITH ORDINALITY AS e(doc, n),
           jsonb_to_record(e.doc) AS r(log_id uuid, message_id text, queue_id text,
                                       recipient text, original_recipient text,
                                       tenant_id uuid)) AS w
LEFT JOIN mdm.aa_email_log v ON v.id = w.log_id
-- A Message-ID postrelay made is `<job id@domain>`: the job index finds its rows.
LEFT JOIN LATERAL (
    SELECT l.id
    FROM mdm.aa_email_log l
    WHERE v.id IS NULL
      AND l.job_id = CAST(substring(w.message_id
                                    FROM '^<([0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})@')
                          AS uuid)
      AND l.message_id = w.message_id
    ORDER BY l.status IN ('sent', 'partial', 'unknown', 'sending') DESC, l.created_at DESC
    LIMIT 1
) by_message ON true
LEFT JOIN LATERAL (
    SELECT l.id
    FROM mdm.aa_email_log l
    WHERE v.id IS NULL AND by_message.id IS NULL
      AND w.queue_id IS NOT NULL AND l.queue_id = w.queue_id
      AND (w.recipient IS NULL
           OR l.recipients && ARRAY[w.recipient, w.original_recipient])
    ORDER BY l.created_at DESC
    LIMIT 1
) by_queue ON true
LEFT JOIN mdm.aa_email_log m ON m.id = COALESCE(v.id, by_message.id, by_queue.id)
ORDER BY w.n;

-- name: email_hour_mark_lock
-- Taken by a batch that may resolve an `unknown` row, before the apply statement takes its
-- snapshot (see email_feedback_apply_many): a tally round running now finishes first, and
-- the apply sees what it wrote.
SELECT FROM mdm.aa_email_hour_rollup FOR SHARE;

-- name: email_feedback_lock
-- Transaction-level advisory locks, one per key (`tenant address`), all taken in one order
-- (no deadlock), before the insert takes its snapshot: the transactions recording the same
-- keys take turns, and each one's insert sees what the one before committed.
-- * class 8058 (RFC 8058): an unsubscribe through a signed link (`clicks`), so that the
--   second of a double click sees the suppression the first made;
-- * class 3464 (RFC 3464): a soft bounce that counts toward the address's limit (`soft`):
--   two deliveries recorded at once each counted the other's bounce out (neither was
--   committed), and the limit reached between them suppressed nothing.
-- An operator's lift (email_suppression_lift) takes both for its address first, so that it
-- comes before or after such a recording, never between its count and its suppression.
-- The classes keep them apart from other advisory locks.
SELECT pg_advisory_xact_lock(k.class, k.key)
FROM (SELECT 8058 AS class, hashtext(key) AS key FROM unnest(CAST(:clicks AS text[])) AS key
      UNION
      SELECT 3464, hashtext(key) FROM unnest(CAST(:soft AS text[])) AS key
      ORDER BY 1, 2) AS k;

-- name: email_feedback_insert_many
-- The feedback rows of a batch (one per report, in the order given; the caller passes each
-- dedupe_key once), except those recorded before (dedupe_key): those return nothing and
-- nothing else happens for them. `soft_before` counts, for a soft bounce, the recipient's
-- earlier matched soft bounces within the window (the statement's snapshot sees none of
-- the rows it inserts, so the caller adds the batch's own); only those about a message
-- sent to the recipient count (`sent_to`, kept on the row: log retention may have deleted
-- the message's row since), so forged reports cannot add up, and only those received
-- since an operator last lifted the address's suppression of every category (a lift
-- starts the count afresh). What counts is what model.counts_as_soft says: soft bounces
-- but the 5.7.x policy blocks that a provider reports as such, and permanent failures
-- whose code names no cause (5.0.0, 5.1.0, 5.3.0, and 5.4.1; model.UNSPECIFIC). No other report reads it,
-- so no other pays for the count.
-- A report with `unless_suppressed_in` (an unsubscribe through a signed link, which every
-- mail of the category repeats) is also left out while the address is suppressed in that
-- category: a second click changes nothing, and a click after a lift unsubscribes again.
-- `received_at` is each row's own time, not the transaction's, so that a batch's reports
-- (a delay, then a bounce) read back in the order they were recorded: a volatile function
-- in the select list is evaluated after the sort, row by row, here in `stamped`, which is
-- materialized so that the order it is read in cannot change it.
-- The rows go in by dedupe_key, not in the batch's order: a row whose key another
-- transaction is inserting waits for that one to end, so two batches that hold some of the
-- same reports (a provider's retry of a delivery still in flight, in another order) would
-- otherwise each wait for the other. In one order, one waits and then finds the other's.
WITH stamped AS MATERIALIZED (
    SELECT w.*, clock_timestamp() AS received_at
    FROM (SELECT r.*, e.n
          FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb))))
               WITH ORDINALITY AS e(doc, n),
               jsonb_to_record(e.doc) AS r(tenant_id uuid, email_log_id uuid,
                                           matched_by text, recipient text, kind text,
                                           status text, diagnostic text, source text,
                                           source_event_id text, dedupe_key text,
                                           detail jsonb, occurred_at timestamptz,
                                           sent_to boolean, unless_suppressed_in text)) AS w
    ORDER BY w.n
)
INSERT INTO mdm.aa_email_feedback (tenant_id, email_log_id, matched_by, recipient, kind,
                                   status, diagnostic, source, source_event_id, dedupe_key,
                                   detail, occurred_at, sent_to, received_at)
SELECT w.tenant_id, w.email_log_id, w.matched_by, w.recipient, w.kind, w.status,
       w.diagnostic, w.source, w.source_event_id, w.dedupe_key, w.detail,
       w.occurred_at, w.sent_to, w.received_at
FROM stamped AS w
WHERE w.unless_suppressed_in IS NULL
   OR NOT EXISTS (SELECT 1 FROM mdm.aa_email_suppression s
                  WHERE s.tenant_id = w.tenant_id AND s.address = w.recipient
                    AND s.category = w.unless_suppressed_in)
ORDER BY w.dedupe_key
ON CONFLICT (dedupe_key) DO NOTHING
RETURNING id, dedupe_key,
    CASE WHEN aa_email_feedback.kind = 'soft-bounced'
              OR aa_email_feedback.kind = 'bounced'
                 AND aa_email_feedback.status ~ '^5\.([0-6]\.0|4\.1)$' THEN
        (SELECT count(*) FROM mdm.aa_email_feedback f
         WHERE f.tenant_id = aa_email_feedback.tenant_id
           AND f.recipient = aa_email_feedback.recipient
           AND (f.kind = 'soft-bounced' AND COALESCE(f.status, '') NOT LIKE '5.7.%'
                OR f.kind = 'bounced' AND f.status ~ '^5\.([0-6]\.0|4\.1)$')
           AND f.sent_to
           AND f.received_at > now() - make_interval(secs => :soft_window_secs)
           AND f.received_at > COALESCE(
               (SELECT max(a.created_at) FROM mdm.aa_email_suppression_audit a
                WHERE a.tenant_id = aa_email_feedback.tenant_id
                  AND a.address = aa_email_feedback.recipient
                  AND a.detail @> '{"lifted": [{"category": ""}]}'), '-infinity'))
    ELSE 0 END AS soft_before;

-- name: email_feedback_apply_many
-- The effects of a batch of recorded feedback (one entry per new feedback row, in the
-- order recorded), in its transaction, as if applied one after the other:
-- * each log row's delivery outcome, raised only (a delay report after the bounce keeps
--   the bounce): DELIVERY_OUTCOMES is in rank order, the batch's highest wins;
-- * an `unknown` row becomes `sent`: the feedback proves the message left (a report about
--   it came back), so a later attempt will not send it again. The batch's first report
--   about the row is the one that resolved it. When the email hour tally has counted the
--   row's hour (orchestrator/email_hours.py), the row moves there too, from `unknown` to
--   `sent`: the bounce and complaint rates count its late bounce or complaint from the
--   log, and so must count it among the messages they divide by;
-- * a job held in the DLQ for that unknown outcome (the template's on_unknown = "hold")
--   is completed without a second send, with an audit row; only when that row is the
--   job's last attempt (a later attempt's failure is another story);
-- * the suppressions the caller decided on: the first report of the batch for an address
--   and category makes it, unless one was there already. The suppression row names the
--   report (feedback_id), which is how readers know that it suppressed: the report's own
--   row is not updated (a second version of it, and an entry in each of its indexes).
-- Log rows are locked in id order, so concurrent batches cannot deadlock on them.
WITH w AS (
    SELECT r.*, e.n
    FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb))))
         WITH ORDINALITY AS e(doc, n),
         jsonb_to_record(e.doc) AS r(email_log_id uuid, feedback_id uuid, delivery text,
                                     tenant_id uuid, recipient text, category text,
                                     reason text, source text, status text,
                                     suppress boolean)
), per_row AS (
    SELECT w.email_log_id, min(w.n) AS first_n,
           max(array_position(CAST(:ranks AS text[]), w.delivery)) AS top_rank
    FROM w
    WHERE w.email_log_id IS NOT NULL
    GROUP BY w.email_log_id
), before AS (
    SELECT l.id, l.tenant_id, l.status, l.job_id, l.attempt, l.created_at, p.first_n,
           f.feedback_id,
           (CAST(:ranks AS text[]))[p.top_rank] AS delivery,
           p.top_rank IS NOT NULL
           AND COALESCE(array_position(CAST(:ranks AS text[]), l.delivery), 0) < p.top_rank
               AS raise_it
    FROM mdm.aa_email_log l
    JOIN per_row p ON p.email_log_id = l.id
    JOIN w f ON f.n = p.first_n
    ORDER BY l.id
    FOR UPDATE OF l
), logged AS (
    UPDATE mdm.aa_email_log l
    SET delivery = CASE WHEN b.raise_it THEN b.delivery ELSE l.delivery END,
        delivery_at = CASE WHEN b.raise_it THEN now() ELSE l.delivery_at END,
        status = CASE WHEN b.status = 'unknown' THEN 'sent' ELSE l.status END,
        error = CASE WHEN b.status = 'unknown'
                     THEN concat_ws('; ', l.error,
                                    'resolved as sent by feedback ' || b.feedback_id)
                     ELSE l.error END
    FROM before b
    WHERE l.id = b.id
    RETURNING b.id, b.tenant_id, b.status AS old_status, b.job_id, b.attempt, b.created_at,
              b.first_n, b.feedback_id
), tallied AS (
    -- The tally's mark, locked in share mode to the commit when the batch resolves an
    -- `unknown` row (the uncorrelated EXISTS is checked once, before the scan): a round
    -- waits for it, then counts the rows `sent`. A batch that matched an `unknown` row
    -- locked it already (email_hour_mark_lock), so this statement sees what every round
    -- before wrote; here again for a row that turned `unknown` since (read as it is now: a
    -- round may have committed meanwhile).
    SELECT r.until
    FROM mdm.aa_email_hour_rollup r
    WHERE EXISTS (SELECT 1 FROM logged g WHERE g.old_status = 'unknown')
    FOR SHARE
), resolved AS (
    SELECT date_trunc('hour', g.created_at, 'UTC') AS hour, g.tenant_id, count(*) AS n
    FROM logged g, tallied t
    WHERE g.old_status = 'unknown' AND g.created_at < t.until
    GROUP BY 1, 2
), retallied AS (
    -- Upserts (ON CONFLICT finds rows a round wrote after this snapshot, should this
    -- statement have waited for the mark), in key order, so that two batches cannot
    -- deadlock. `unknown` only where the tally holds it: a row written after its hour was
    -- tallied (a lost attempt found later) was never counted there. The tally has no rows
    -- of a deleted tenant.
    INSERT INTO mdm.aa_email_hour AS h (hour, tenant_id, status, messages)
    SELECT r.hour, r.tenant_id, m.status, m.sign * r.n
    FROM resolved r
    JOIN mdm.aa_tenant t ON t.id = r.tenant_id
    CROSS JOIN (VALUES ('sent', 1), ('unknown', -1)) AS m(status, sign)
    WHERE m.status = 'sent'
       OR EXISTS (SELECT 1 FROM mdm.aa_email_hour c
                  WHERE c.hour = r.hour AND c.tenant_id = r.tenant_id
                    AND c.status = 'unknown')
    ORDER BY 1, 2, 3
    ON CONFLICT (hour, tenant_id, status)
    DO UPDATE SET messages = GREATEST(h.messages + EXCLUDED.messages, 0)
), held AS (
    UPDATE mdm.aa_job j
    SET status = 'done', completed_at = now()
    FROM logged g
    WHERE g.old_status = 'unknown' AND j.id = g.job_id AND j.status = 'dlq'
      AND NOT EXISTS (SELECT 1 FROM mdm.aa_email_log later
                      WHERE later.job_id = g.job_id AND later.id <> g.id
                        AND (later.attempt, later.created_at) >= (g.attempt, g.created_at))
    RETURNING j.id, j.tenant_id, j.job_kind, j.attempts, j.last_error, g.first_n,
              g.feedback_id
), audited AS (
    INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, actor, detail)
    SELECT h.id, h.tenant_id, h.job_kind, 'job_complete', 'feedback',
           jsonb_build_object('reason', 'feedback proved the held message was sent',
                              'feedback_id', h.feedback_id, 'attempts', h.attempts,
                              'last_error', h.last_error)
    FROM held h
), suppressed AS (
    INSERT INTO mdm.aa_email_suppression (tenant_id, address, category, reason, source,
                                          smtp_enhanced, email_log_id, feedback_id)
    SELECT DISTINCT ON (w.tenant_id, w.recipient, w.category)
           w.tenant_id, w.recipient, w.category, w.reason, w.source, w.status,
           w.email_log_id, w.feedback_id
    FROM w
    WHERE w.suppress
    ORDER BY w.tenant_id, w.recipient, w.category, w.n
    ON CONFLICT (tenant_id, address, category) DO NOTHING
    RETURNING feedback_id
)
SELECT w.n, g.old_status, h.id AS completed_job,
       w.feedback_id IN (SELECT feedback_id FROM suppressed) AS suppressed
FROM w
LEFT JOIN logged g ON g.first_n = w.n
LEFT JOIN held h ON h.first_n = w.n
ORDER BY w.n;

-- name: email_feedback_list
-- Feedback, newest first, narrowed by tenant, kind, source, time, or to the unmatched
-- (no log row took the report's word: nothing named, or a recipient it never had; and
-- no signed unsubscribe link named the recipient: matched_by 'token').
-- `suppressed`: the report made a suppression that stands (its row names the report) or
-- that was lifted since (the lift set the flag). The suppression is looked up per row
-- shown, through ix_email_suppression_feedback: written as an EXISTS, the planner may
-- instead hash the whole suppression list to answer one page.
SELECT f.id, f.tenant_id, f.email_log_id, f.matched_by, f.recipient, f.kind, f.status,
       f.diagnostic, f.source, f.source_event_id,
       f.suppressed OR made.feedback_id IS NOT NULL AS suppressed,
       f.detail, f.occurred_at, f.received_at
FROM mdm.aa_email_feedback f
LEFT JOIN LATERAL (SELECT s.feedback_id FROM mdm.aa_email_suppression s
                   WHERE s.feedback_id = f.id LIMIT 1) made ON true
WHERE (CAST(:tenant_id AS uuid) IS NULL OR f.tenant_id = CAST(:tenant_id AS uuid))
  AND (CAST(:kind AS text) IS NULL OR f.kind = CAST(:kind AS text))
  AND (CAST(:source AS text) IS NULL OR f.source = CAST(:source AS text))
  AND (CAST(:since AS timestamptz) IS NULL OR f.received_at >= CAST(:since AS timestamptz))
  AND (NOT CAST(:unmatched AS boolean) OR f.matched_by IS NULL)
ORDER BY f.received_at DESC, f.id DESC
LIMIT :limit;

-- name: email_feedback_delete_before
-- Retention of the feedback (POSTRELAY_EMAIL_FEEDBACK_RETENTION_DAYS, else the email log's
-- window): one bounded batch of rows received before :before, the oldest first, unmatched
-- ones included, through ix_email_feedback_time. Suppressions name their feedback by id
-- without a foreign key, so a suppression stays when the report behind it goes.
DELETE FROM mdm.aa_email_feedback
WHERE id IN (SELECT id FROM mdm.aa_email_feedback
             WHERE received_at < CAST(:before AS timestamptz)
             ORDER BY received_at
             LIMIT :batch);

-- name: email_suppression_audit_delete_before
-- Retention of the suppression audit (POSTRELAY_AUDIT_RETENTION_DAYS, with the other
-- audits; kept when unset): one bounded batch, the oldest first, through
-- ix_email_suppression_audit_time (migration 0018). The suppressions themselves stay. No
-- row younger than :keep_secs goes, whatever :before says: the soft-bounce window, measured
-- on the database's clock, which created_at is written with (a cutoff from the host's
-- clock deleted the lifts of the last month on a host a month fast).
DELETE FROM mdm.aa_email_suppression_audit
WHERE id IN (SELECT id FROM mdm.aa_email_suppression_audit
             WHERE created_at < LEAST(CAST(:before AS timestamptz),
                                      now() - make_interval(secs => :keep_secs))
             ORDER BY created_at
             LIMIT :batch);

-- name: email_suppression_lift
-- An operator lets an address receive a tenant's mail again in one category: '' (a bounce,
-- a complaint, a refusal at send time: every category) or a name (its unsubscribe from
-- that category, its own choice, which lifting a bounce leaves alone). One audit row keeps
-- what was lifted and by whom (none when nothing was); the reports that made the rows keep,
-- in their own flag, that they suppressed. `others`: the categories still suppressed.
-- The audit row's time is the lift's own (clock_timestamp), not its transaction's start:
-- the count of soft bounces starts afresh after it, and a soft bounce recorded while the
-- lift waited for the address (email_feedback_lock) came before the lift, later than the
-- transaction began.
WITH lifted AS (
    DELETE FROM mdm.aa_email_suppression
    WHERE tenant_id = CAST(:tenant_id AS uuid) AND address = :address
      AND category = :category
    RETURNING category, reason, source, smtp_enhanced, feedback_id, created_at
), kept AS (
    UPDATE mdm.aa_email_feedback SET suppressed = true
    WHERE id = ANY (ARRAY(SELECT feedback_id FROM lifted WHERE feedback_id IS NOT NULL))
), audited AS (
    INSERT INTO mdm.aa_email_suppression_audit (tenant_id, address, action, actor, detail,
                                                created_at)
    SELECT CAST(:tenant_id AS uuid), :address, 'unsuppress', :actor,
           jsonb_build_object('lifted', jsonb_agg(to_jsonb(l) ORDER BY l.category)),
           clock_timestamp()
    FROM lifted l
    HAVING count(*) > 0
    RETURNING id
)
SELECT (SELECT count(*) FROM lifted) AS lifted,
       ARRAY(SELECT s.category FROM mdm.aa_email_suppression s
             WHERE s.tenant_id = CAST(:tenant_id AS uuid) AND s.address = :address
               AND s.category <> :category
             ORDER BY s.category) AS others;

-- name: email_suppression_audit_list
SELECT id, tenant_id, address, action, actor, detail, created_at
FROM mdm.aa_email_suppression_audit
WHERE (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
  AND (CAST(:address AS text) IS NULL OR address = CAST(:address AS text))
ORDER BY created_at DESC, id DESC
LIMIT :limit;


-- name: email_feedback_counts
-- Feedback received since :since by kind and source (ix_email_feedback_time), and how much
-- of it matched nothing (neither a message nor, for a signed link's unsubscribe, a tenant).
SELECT f.kind, f.source, count(*) AS received,
       count(*) FILTER (WHERE f.matched_by IS NULL) AS unmatched
FROM mdm.aa_email_feedback f
WHERE f.received_at >= CAST(:since AS timestamptz)
GROUP BY f.kind, f.source
ORDER BY f.kind, f.source;

-- name: email_feedback_rates
-- Per tenant, of the messages that got an answer (sent, partial, or refused: bounced) in
-- the last 24 hours and 7 days before :now, each window starting on a whole UTC hour: how
-- many bounced — refused at send time, or bounced later as feedback said — and how many
-- drew a complaint. The rates mailbox providers watch. The messages by status come from
-- the hours the email hour tally holds (before :until, its mark: orchestrator/email_hours.py)
-- and, after the mark, from the log rows themselves; what feedback said later (a few rows,
-- and it changes rows the tally counted long before) from the log, through
-- ix_email_log_delivery_time.
WITH bounds AS (
    SELECT date_trunc('hour', CAST(:now AS timestamptz) - interval '24 hours', 'UTC') AS day,
           date_trunc('hour', CAST(:now AS timestamptz) - interval '7 days', 'UTC') AS week
), answered AS (
    SELECT h.tenant_id, h.hour AS at, h.status, h.messages AS n
    FROM mdm.aa_email_hour h, bounds b
    WHERE h.status IN ('sent', 'partial', 'bounced')
      AND h.hour >= b.week AND h.hour < CAST(:until AS timestamptz)
      AND (CAST(:tenant_id AS uuid) IS NULL OR h.tenant_id = CAST(:tenant_id AS uuid))
    UNION ALL
    SELECT l.tenant_id, l.created_at, l.status, 1
    FROM mdm.aa_email_log l, bounds b
    WHERE l.status IN ('sent', 'partial', 'bounced')
      AND l.created_at >= GREATEST(b.week, CAST(:until AS timestamptz))
      AND l.created_at <= CAST(:now AS timestamptz)
      AND (CAST(:tenant_id AS uuid) IS NULL OR l.tenant_id = CAST(:tenant_id AS uuid))
), per_tenant AS (
    SELECT a.tenant_id,
           sum(a.n) FILTER (WHERE a.at >= b.day) AS messages_24h,
           sum(a.n) FILTER (WHERE a.at >= b.day AND a.status = 'bounced') AS refused_24h,
           sum(a.n) AS messages_7d,
           sum(a.n) FILTER (WHERE a.status = 'bounced') AS refused_7d
    FROM answered a, bounds b
    GROUP BY a.tenant_id
), later AS (
    SELECT l.tenant_id,
           count(*) FILTER (WHERE l.created_at >= b.day AND l.delivery = 'bounced'
                              AND l.status <> 'bounced') AS bounced_24h,
           count(*) FILTER (WHERE l.created_at >= b.day AND l.delivery = 'complained')
               AS complained_24h,
           count(*) FILTER (WHERE l.delivery = 'bounced' AND l.status <> 'bounced')
               AS bounced_7d,
           count(*) FILTER (WHERE l.delivery = 'complained') AS complained_7d
    FROM mdm.aa_email_log l, bounds b
    WHERE l.delivery IN ('bounced', 'complained')
      AND l.status IN ('sent', 'partial', 'bounced')
      AND l.created_at >= b.week AND l.created_at <= CAST(:now AS timestamptz)
      AND (CAST(:tenant_id AS uuid) IS NULL OR l.tenant_id = CAST(:tenant_id AS uuid))
    GROUP BY l.tenant_id
)
SELECT p.tenant_id, t.name AS tenant_name,
       CAST(COALESCE(p.messages_24h, 0) AS bigint) AS messages_24h,
       CAST(COALESCE(p.refused_24h, 0) + COALESCE(r.bounced_24h, 0) AS bigint) AS bounced_24h,
       COALESCE(r.complained_24h, 0) AS complained_24h,
       CAST(p.messages_7d AS bigint) AS messages_7d,
       CAST(COALESCE(p.refused_7d, 0) + COALESCE(r.bounced_7d, 0) AS bigint) AS bounced_7d,
       COALESCE(r.complained_7d, 0) AS complained_7d
FROM per_tenant p
JOIN mdm.aa_tenant t ON t.id = p.tenant_id
LEFT JOIN later r ON r.tenant_id = p.tenant_id
ORDER BY t.name, p.tenant_id;

-- name: feedback_inbox_insert
-- The messages `postrelay inbound` accepted during the last commit: per message its RCPT TO
-- list as a JSON array (`envelopes`) and its raw bytes (`raws`), both sent as binary
-- parameters, so the bytes go over the wire and into the row as they are. One statement in
-- its own transaction (autocommit: a single round trip), whose commit is the durability
-- point of their 250s: it waits for the WAL flush. The statement asks for that itself, for
-- its own transaction: behind a transaction pooler the receiver's startup setting is
-- dropped, and the server connection may carry another client's `SET synchronous_commit
-- = off`. A volatile CTE is evaluated, once, before the first row is inserted.
WITH flushed AS (SELECT set_config('synchronous_commit', 'on', true))
INSERT INTO mdm.aa_feedback_inbox (envelope_to, raw)
SELECT ARRAY(SELECT json_array_elements_text(CAST(m.envelope_to AS json))), m.raw
FROM unnest(CAST(:envelopes AS text[]), CAST(:raws AS bytea[])) AS m(envelope_to, raw)
CROSS JOIN flushed;

-- name: feedback_inbox_take
-- Up to :limit messages ready to record, oldest first by the primary key (ids are time
-- ordered), taken out of the inbox by the transaction that records them: a rollback puts
-- them back. Rows another processor holds are skipped. The transaction's commit waits for
-- its WAL flush, though a lost one would only leave the rows here to be recorded again:
-- unflushed, a batch's WAL (hundreds of kB) is flushed by the next inbox write's commit,
-- which the SMTP sessions it answers wait for. The rows come back in no order: the
-- caller sorts them by id. `= ANY(ARRAY(...))`, not `IN (...)`: under the receiver's generic
-- plans the IN form joined the whole inbox to the batch's ids, a scan per batch that makes
-- draining a large backlog quadratic.
DELETE FROM mdm.aa_feedback_inbox
WHERE id = ANY (ARRAY(SELECT i.id
                      FROM mdm.aa_feedback_inbox i
                      WHERE i.available_at <= now()
                      ORDER BY i.id
                      LIMIT :limit
                      FOR UPDATE SKIP LOCKED))
RETURNING id, envelope_to, raw, attempts,
          set_config('synchronous_commit', 'on', true) AS synchronous_commit;

-- name: feedback_inbox_take_one
-- One message of a batch that failed, retried on its own (skipped if another holds it).
DELETE FROM mdm.aa_feedback_inbox
WHERE id = ANY (ARRAY(SELECT i.id
                      FROM mdm.aa_feedback_inbox i
                      WHERE i.id = CAST(:id AS uuid)
                      FOR UPDATE SKIP LOCKED))
RETURNING id, envelope_to, raw, attempts,
          set_config('synchronous_commit', 'on', true) AS synchronous_commit;

-- name: feedback_inbox_retry_later
-- A message that could not be recorded on its own: tried again after :delay_secs.
UPDATE mdm.aa_feedback_inbox
SET attempts = attempts + 1, last_error = :error,
    available_at = now() + make_interval(secs => CAST(:delay_secs AS double precision))
WHERE id = CAST(:id AS uuid);

-- name: feedback_inbox_backlog
-- Messages accepted and not recorded yet, and how long the oldest has waited (NULL: none).
SELECT count(*) AS waiting,
       extract(epoch FROM now() - min(i.received_at))::float8 AS oldest_age_secs
FROM mdm.aa_feedback_inbox i;
