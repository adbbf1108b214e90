-- Statements of delivery feedback: aa_email_feedback, and its effects on aa_email_log,
-- aa_email_suppression and a held email_send job.

-- name: email_feedback_match_many
-- The log row each piece of feedback of a batch is about (one row per report, in the
-- order given; NULLs where nothing matched), by the strongest key it carries: the VERP
-- token's log row (verified before it gets here), the Message-ID postrelay generated (the
-- same on every attempt of a job: the attempt that went out is preferred, the latest of
-- them), or the relay's queue id from its 250 reply (not unique across relays and time:
-- the latest row with that id sent to the recipient). One statement for a batch: a
-- provider's hundred events cost one round trip here, not a hundred.
SELECT w.n, m.id, m.tenant_id, m.job_id, m.status, m.recipients, m.category, m.template,
       m.message_id, m.matched_by
FROM unnest(CAST(:log_ids AS uuid[]), CAST(:message_ids AS text[]),
            CAST(:queue_ids AS text[]), CAST(:recipients AS text[]))
     WITH ORDINALITY AS w(log_id, message_id, queue_id, recipient, n)
LEFT JOIN LATERAL (
    SELECT l.id, l.tenant_id, l.job_id, l.status, l.recipients, l.category, l.template,
           l.message_id, c.matched_by
    FROM (
        SELECT l.id, 'verp' AS matched_by, 1 AS rank
        FROM mdm.aa_email_log l
        WHERE l.id = w.log_id
        UNION ALL
        -- A Message-ID postrelay made is `<job id@domain>`: the job index finds its rows.
        (SELECT l.id, 'message_id', 2
         FROM mdm.aa_email_log l
         WHERE l.job_id = CAST(substring(w.message_id
                                         FROM '^<([0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})@')
                               AS uuid)
           AND l.message_id = w.message_id
         ORDER BY l.status IN ('sent', 'partial', 'unknown', 'sending') DESC,
                  l.created_at DESC
         LIMIT 1)
        UNION ALL
        (SELECT l.id, 'queue_id', 3
         FROM mdm.aa_email_log l
         WHERE w.queue_id IS NOT NULL AND l.queue_id = w.queue_id
           AND (w.recipient IS NULL OR l.recipients @> ARRAY[w.recipient])
         ORDER BY l.created_at DESC
         LIMIT 1)
    ) c
    JOIN mdm.aa_email_log l ON l.id = c.id
    ORDER BY c.rank
    LIMIT 1
) m ON true
ORDER BY w.n;

-- name: email_feedback_insert
-- The feedback row, unless the same feedback was recorded before (dedupe_key): then
-- nothing is returned and nothing else happens. `soft_before` counts this recipient's
-- earlier matched soft bounces within the window (the statement's snapshot does not see
-- the row it inserts); only those about a message sent to the recipient count, so forged
-- reports cannot add up.
INSERT INTO mdm.aa_email_feedback (tenant_id, email_log_id, matched_by, recipient, kind,
                                   status, diagnostic, source, source_event_id, dedupe_key,
                                   detail, occurred_at)
VALUES (CAST(:tenant_id AS uuid), CAST(:email_log_id AS uuid), :matched_by, :recipient,
        :kind, :status, :diagnostic, :source, :source_event_id, :dedupe_key,
        CAST(:detail AS jsonb), CAST(:occurred_at AS timestamptz))
ON CONFLICT (dedupe_key) DO NOTHING
RETURNING id, received_at,
    (SELECT count(*) FROM mdm.aa_email_feedback f
     WHERE f.tenant_id = CAST(:tenant_id AS uuid) AND f.recipient = :recipient
       AND f.kind = 'soft-bounced'
       AND EXISTS (SELECT 1 FROM mdm.aa_email_log l
                   WHERE l.id = f.email_log_id AND f.recipient = ANY(l.recipients))
       AND f.received_at > now() - make_interval(secs => :soft_window_secs)) AS soft_before;

-- name: email_feedback_apply
-- The effects of one recorded piece of feedback, in its transaction:
-- * the log row's delivery outcome, raised only (a delay report after the bounce keeps
--   the bounce): DELIVERY_OUTCOMES is in rank order;
-- * an `unknown` row becomes `sent`: the feedback proves the message left (a report about
--   it came back), so a later attempt will not send it again;
-- * a job held in the DLQ for that unknown outcome (the template's on_unknown = "hold")
--   is completed without a second send, with an audit row; only when that row is the
--   job's last attempt (a later attempt's failure is another story);
-- * the suppression, when the caller decided on one.
WITH before AS (
    SELECT id, status, job_id, attempt, created_at,
           CAST(:delivery AS text) IS NOT NULL
           AND COALESCE(array_position(CAST(:ranks AS text[]), delivery), 0)
               < array_position(CAST(:ranks AS text[]), CAST(:delivery AS text)) AS raise_it
    FROM mdm.aa_email_log
    WHERE id = CAST(:email_log_id AS uuid)
    FOR UPDATE
), logged AS (
    UPDATE mdm.aa_email_log l
    SET delivery = CASE WHEN b.raise_it THEN CAST(:delivery AS text) ELSE l.delivery END,
        delivery_at = CASE WHEN b.raise_it THEN now() ELSE l.delivery_at END,
        status = CASE WHEN b.status = 'unknown' THEN 'sent' ELSE l.status END,
        error = CASE WHEN b.status = 'unknown'
                     THEN concat_ws('; ', l.error, 'resolved as sent by feedback ' || :feedback_id)
                     ELSE l.error END
    FROM before b
    WHERE l.id = b.id
    RETURNING b.id, b.status AS old_status, b.job_id, b.attempt, b.created_at
), held AS (
    UPDATE mdm.aa_job j
    SET status = 'done', completed_at = now()
    FROM logged g
    WHERE g.old_status = 'unknown' AND j.id = g.job_id AND j.status = 'dlq'
      AND NOT EXISTS (SELECT 1 FROM mdm.aa_email_log later
                      WHERE later.job_id = g.job_id AND later.id <> g.id
                        AND (later.attempt, later.created_at) >= (g.attempt, g.created_at))
    RETURNING j.id, j.tenant_id, j.job_kind, j.attempts, j.last_error
), audited AS (
    INSERT INTO mdm.aa_job_audit (job_id, tenant_id, job_kind, action, actor, detail)
    SELECT h.id, h.tenant_id, h.job_kind, 'job_complete', 'feedback',
           jsonb_build_object('reason', 'feedback proved the held message was sent',
                              'feedback_id', :feedback_id, 'attempts', h.attempts,
                              'last_error', h.last_error)
    FROM held h
), suppressed AS (
    INSERT INTO mdm.aa_email_suppression (tenant_id, address, category, reason, source,
                                          smtp_enhanced, email_log_id, feedback_id)
    SELECT CAST(:tenant_id AS uuid), :recipient, :category, :reason, :source, :status,
           CAST(:email_log_id AS uuid), CAST(:feedback_id AS uuid)
    WHERE CAST(:suppress AS boolean)
    ON CONFLICT (tenant_id, address, category) DO NOTHING
    RETURNING address
), marked AS (
    UPDATE mdm.aa_email_feedback SET suppressed = true
    WHERE id = CAST(:feedback_id AS uuid) AND EXISTS (SELECT 1 FROM suppressed)
)
SELECT (SELECT old_status FROM logged) AS old_status,
       (SELECT id FROM held) AS completed_job,
       EXISTS (SELECT 1 FROM suppressed) AS suppressed;

-- name: email_feedback_list
-- Feedback, newest first, narrowed by tenant, kind, source, time, or to the unmatched
-- (no log row took the report's word: nothing named, or a recipient it never had).
SELECT f.id, f.tenant_id, f.email_log_id, f.matched_by, f.recipient, f.kind, f.status,
       f.diagnostic, f.source, f.source_event_id, f.suppressed, f.detail, f.occurred_at,
       f.received_at
FROM mdm.aa_email_feedback f
WHERE (CAST(:tenant_id AS uuid) IS NULL OR f.tenant_id = CAST(:tenant_id AS uuid))
  AND (CAST(:kind AS text) IS NULL OR f.kind = CAST(:kind AS text))
  AND (CAST(:source AS text) IS NULL OR f.source = CAST(:source AS text))
  AND (CAST(:since AS timestamptz) IS NULL OR f.received_at >= CAST(:since AS timestamptz))
  AND (NOT CAST(:unmatched AS boolean) OR f.email_log_id IS NULL)
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
-- ix_email_suppression_audit_time (migration 0018). The suppressions themselves stay.
DELETE FROM mdm.aa_email_suppression_audit
WHERE id IN (SELECT id FROM mdm.aa_email_suppression_audit
             WHERE created_at < CAST(:before AS timestamptz)
             ORDER BY created_at
             LIMIT :batch);

-- name: email_suppression_lift
-- An operator lets an address receive a tenant's mail again: every category's row goes,
-- and one audit row keeps what was lifted and by whom. Nothing is audited when nothing
-- was suppressed.
WITH lifted AS (
    DELETE FROM mdm.aa_email_suppression
    WHERE tenant_id = CAST(:tenant_id AS uuid) AND address = :address
    RETURNING category, reason, source, smtp_enhanced, feedback_id, created_at
), audited AS (
    INSERT INTO mdm.aa_email_suppression_audit (tenant_id, address, action, actor, detail)
    SELECT CAST(:tenant_id AS uuid), :address, 'unsuppress', :actor,
           jsonb_build_object('lifted', jsonb_agg(to_jsonb(l) ORDER BY l.category))
    FROM lifted l
    HAVING count(*) > 0
    RETURNING id
)
SELECT (SELECT count(*) FROM lifted) AS lifted;

-- name: email_suppression_audit_list
SELECT id, tenant_id, address, action, actor, detail, created_at
FROM mdm.aa_email_suppression_audit
WHERE (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
  AND (CAST(:address AS text) IS NULL OR address = CAST(:address AS text))
ORDER BY created_at DESC, id DESC
LIMIT :limit;


-- name: email_feedback_counts
-- Feedback received since :since by kind and source (ix_email_feedback_time), and how much
-- of it matched no message.
SELECT f.kind, f.source, count(*) AS received,
       count(*) FILTER (WHERE f.email_log_id IS NULL) AS unmatched
FROM mdm.aa_email_feedback f
WHERE f.received_at >= CAST(:since AS timestamptz)
GROUP BY f.kind, f.source
ORDER BY f.kind, f.source;

-- name: email_feedback_rates
-- Per tenant, of the messages that got an answer (sent, partial, or refused: bounced) in
-- the last 24 hours and 7 days before :now: how many bounced — refused at send time, or
-- bounced later as feedback said — and how many drew a complaint. The rates mailbox
-- providers watch. Rows of 7 days by ix_email_log_status_time.
SELECT l.tenant_id, t.name AS tenant_name,
       count(*) FILTER (WHERE l.created_at >= CAST(:now AS timestamptz) - interval '24 hours')
           AS messages_24h,
       count(*) FILTER (WHERE l.created_at >= CAST(:now AS timestamptz) - interval '24 hours'
                          AND (l.status = 'bounced' OR l.delivery = 'bounced'))
           AS bounced_24h,
       count(*) FILTER (WHERE l.created_at >= CAST(:now AS timestamptz) - interval '24 hours'
                          AND l.delivery = 'complained') AS complained_24h,
       count(*) AS messages_7d,
       count(*) FILTER (WHERE l.status = 'bounced' OR l.delivery = 'bounced') AS bounced_7d,
       count(*) FILTER (WHERE l.delivery = 'complained') AS complained_7d
FROM mdm.aa_email_log l
JOIN mdm.aa_tenant t ON t.id = l.tenant_id
WHERE l.status IN ('sent', 'partial', 'bounced')
  AND l.created_at >= CAST(:now AS timestamptz) - interval '7 days'
  AND l.created_at <= CAST(:now AS timestamptz)
  AND (CAST(:tenant_id AS uuid) IS NULL OR l.tenant_id = CAST(:tenant_id AS uuid))
GROUP BY l.tenant_id, t.name
ORDER BY t.name, l.tenant_id;
