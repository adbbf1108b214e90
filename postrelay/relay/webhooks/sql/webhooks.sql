-- Webhooks: endpoints (managed by operators) and the delivery log (written by the handler).
-- Every statement that changes an endpoint also sends NOTIFY postrelay_webhooks, delivered
-- at commit, so the relays' endpoint directories reload at once instead of within a second.

-- name: webhook_endpoint_insert
-- Selecting from aa_tenant turns an unknown tenant into "no row" instead of a foreign-key
-- error that would abort the caller's transaction.
WITH inserted AS (
    INSERT INTO mdm.aa_webhook_endpoint (tenant_id, url, secret, event_types, ca_pem,
                                         private_allowed)
    SELECT t.id, :url, :secret, CAST(:event_types AS text[]), CAST(:ca_pem AS text),
           CAST(:private_allowed AS boolean)
    FROM mdm.aa_tenant t
    WHERE t.id = :tenant_id
    RETURNING id, tenant_id, url, event_types, enabled, disabled_reason, disabled_by,
              created_at, updated_at, ca_pem IS NOT NULL AS private_ca
)
SELECT inserted.*, pg_notify('postrelay_webhooks', '') AS _notified FROM inserted;

-- name: webhook_endpoint_list
-- Whether an endpoint has a private CA, never the CA itself.
SELECT id, tenant_id, url, event_types, enabled, disabled_reason, disabled_by, created_at,
       updated_at, ca_pem IS NOT NULL AS private_ca
FROM mdm.aa_webhook_endpoint
WHERE CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid)
ORDER BY tenant_id, created_at, id;

-- name: webhook_endpoint_set_enabled
-- :disabled_by is NULL to enable, or who disables: 'operator' (no :tenant_id) or 'tenant'.
-- The guard leaves an endpoint an operator disabled to operators: a tenant's call changes
-- nothing there, neither enabling it nor taking its disable over; webhook_endpoint_get
-- then says why nothing changed (endpoints.py).
WITH changed AS (
    UPDATE mdm.aa_webhook_endpoint
    SET enabled = :enabled,
        disabled_reason = CASE WHEN :enabled THEN NULL ELSE :reason END,
        disabled_by = CAST(:disabled_by AS text),
        updated_at = now()
    WHERE id = :id
      AND (CAST(:tenant_id AS uuid) IS NULL
           OR (tenant_id = CAST(:tenant_id AS uuid)
               AND disabled_by IS DISTINCT FROM 'operator'))
    RETURNING id, tenant_id, url, event_types, enabled, disabled_reason, disabled_by,
              created_at, updated_at, ca_pem IS NOT NULL AS private_ca
)
SELECT changed.*, pg_notify('postrelay_webhooks', '') AS _notified FROM changed;

-- name: webhook_endpoint_set_ca
-- Trust a private CA (NULL: the default bundle again). A CA is for https:// endpoints
-- only: the guard leaves an http:// one unchanged, and webhook_endpoint_get says why.
WITH changed AS (
    UPDATE mdm.aa_webhook_endpoint
    SET ca_pem = CAST(:ca_pem AS text), updated_at = now()
    WHERE id = :id
      AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
      AND (CAST(:ca_pem AS text) IS NULL OR left(url, 8) = 'https://')
    RETURNING id, tenant_id, url, event_types, enabled, disabled_reason, disabled_by,
              created_at, updated_at, ca_pem IS NOT NULL AS private_ca
)
SELECT changed.*, pg_notify('postrelay_webhooks', '') AS _notified FROM changed;

-- name: webhook_endpoint_get
SELECT id, tenant_id, url, event_types, enabled, disabled_reason, disabled_by, created_at,
       updated_at, ca_pem IS NOT NULL AS private_ca
FROM mdm.aa_webhook_endpoint
WHERE id = :id
  AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid));

-- name: webhook_endpoint_delete
WITH deleted AS (
    DELETE FROM mdm.aa_webhook_endpoint
    WHERE id = :id
      AND (CAST(:tenant_id AS uuid) IS NULL OR tenant_id = CAST(:tenant_id AS uuid))
    RETURNING id
)
SELECT deleted.id, pg_notify('postrelay_webhooks', '') AS _notified FROM deleted;

-- name: webhook_endpoint_disable_gone
-- The receiver answered 410 Gone. Guarded by `enabled` so that concurrent deliveries to the
-- same endpoint disable it (and notify) once.
WITH changed AS (
    UPDATE mdm.aa_webhook_endpoint
    SET enabled = false, disabled_reason = :reason, disabled_by = 'receiver', updated_at = now()
    WHERE id = :id AND enabled
    RETURNING id
)
SELECT changed.id, pg_notify('postrelay_webhooks', '') AS _notified FROM changed;

-- name: webhook_endpoint_directory
-- What the relay's endpoint directory caches: every enabled endpoint's filter, and the
-- hash of its id and row version (xmin: the transaction that wrote it) that
-- webhook_endpoint_directory_version sums up.
SELECT id, tenant_id, event_types,
       hashtextextended(CAST(id AS text) || '/' || CAST(xmin AS text), 0) AS version
FROM mdm.aa_webhook_endpoint
WHERE enabled;

-- name: webhook_endpoint_directory_version
-- What a relay batch compares with its directory's snapshot, in the batch's transaction
-- after its claim: the count of enabled endpoints and the sum of their (id, row version)
-- hashes. An endpoint added, enabled, disabled, removed or changed changes the count or
-- the sum (a row's new version is another transaction's id), so a difference means the
-- snapshot misses a change that may have committed before the batch's events did. Hashed,
-- not the versions summed as they are: transaction ids are close together, so one change
-- could offset another's (a row of xid 5 removed as one of xid 7 is rewritten by xid 12).
-- One scan of the enabled endpoints, without sending them.
SELECT count(*) AS endpoints,
       CAST(coalesce(sum(hashtextextended(CAST(id AS text) || '/' || CAST(xmin AS text), 0)),
                     0) AS text) AS versions
FROM mdm.aa_webhook_endpoint
WHERE enabled;

-- name: webhook_delivery_load
-- Everything one delivery needs, in one round trip. The outer join from a one-row VALUES
-- keeps a row when the event (deleted by retention) or the endpoint (removed) is gone.
-- The event's time as outbox_claim_batch reads it: one past Python's years (SQL by hand)
-- as the latest or earliest it has, so that the body's timestamp says as much.
SELECT e.id AS event_id, e.tenant_id AS event_tenant_id, e.event_type, e.payload,
       LEAST(GREATEST(e.created_at, TIMESTAMPTZ '0001-01-01 00:00:00+00'),
             TIMESTAMPTZ '9999-12-31 23:59:59.999999+00') AS event_created_at,
       w.id AS endpoint_id, w.tenant_id AS endpoint_tenant_id, w.url, w.secret, w.ca_pem,
       w.enabled, w.private_allowed,
       EXISTS (SELECT 1 FROM mdm.aa_webhook_attempt a
               WHERE a.event_id = CAST(:event_id AS uuid)
                 AND a.endpoint_id = CAST(:endpoint_id AS uuid)
                 AND a.status_code BETWEEN 200 AND 299) AS delivered
FROM (VALUES (1)) AS one(x)
LEFT JOIN mdm.aa_outbox_event e ON e.id = CAST(:event_id AS uuid)
LEFT JOIN mdm.aa_webhook_endpoint w ON w.id = CAST(:endpoint_id AS uuid);

-- name: webhook_delivery_load_many
-- webhook_delivery_load for a claim's deliveries at once (handler.py, claimed.py): one row
-- per (job, event, endpoint) given, with the job's id. A left join from the given rows keeps
-- a row when the event or the endpoint is gone, as above.
SELECT p.job_id, e.id AS event_id, e.tenant_id AS event_tenant_id, e.event_type, e.payload,
       LEAST(GREATEST(e.created_at, TIMESTAMPTZ '0001-01-01 00:00:00+00'),
             TIMESTAMPTZ '9999-12-31 23:59:59.999999+00') AS event_created_at,
       w.id AS endpoint_id, w.tenant_id AS endpoint_tenant_id, w.url, w.secret, w.ca_pem,
       w.enabled, w.private_allowed,
       EXISTS (SELECT 1 FROM mdm.aa_webhook_attempt a
               WHERE a.event_id = p.event_id
                 AND a.endpoint_id = p.endpoint_id
                 AND a.status_code BETWEEN 200 AND 299) AS delivered
FROM jsonb_to_recordset(CAST(:pairs AS jsonb)) AS p(job_id uuid, event_id uuid, endpoint_id uuid)
LEFT JOIN mdm.aa_outbox_event e ON e.id = p.event_id
LEFT JOIN mdm.aa_webhook_endpoint w ON w.id = p.endpoint_id;

-- name: webhook_attempt_insert
INSERT INTO mdm.aa_webhook_attempt
    (job_id, endpoint_id, event_id, attempt, status_code, duration_ms, response_body, error)
SELECT :job_id, w.id, :event_id, :attempt, :status_code, :duration_ms, :response_body, :error
FROM mdm.aa_webhook_endpoint w
WHERE w.id = :endpoint_id;

-- name: webhook_attempt_insert_many
-- The attempts of a batch of deliveries, written with their jobs' outcomes (handler.py:
-- record_with_outcome). An endpoint deleted meanwhile takes its attempts with it, as above.
INSERT INTO mdm.aa_webhook_attempt
    (job_id, endpoint_id, event_id, attempt, status_code, duration_ms, response_body, error)
SELECT r.job_id, w.id, r.event_id, r.attempt, r.status_code, r.duration_ms, r.response_body,
       r.error
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
    job_id uuid, endpoint_id uuid, event_id uuid, attempt integer, status_code integer,
    duration_ms integer, response_body text, error text)
JOIN mdm.aa_webhook_endpoint w ON w.id = r.endpoint_id;

-- name: webhook_attempt_list
-- :tenant_id (NULL: every tenant) holds the log to that tenant's endpoints, as a tenant
-- key's view of it must be.
SELECT a.id, a.job_id, a.endpoint_id, a.event_id, a.attempt, a.status_code, a.duration_ms,
       a.response_body, a.error, a.created_at
FROM mdm.aa_webhook_attempt a
WHERE (CAST(:endpoint_id AS uuid) IS NULL OR a.endpoint_id = CAST(:endpoint_id AS uuid))
  AND (CAST(:event_id AS uuid) IS NULL OR a.event_id = CAST(:event_id AS uuid))
  AND (CAST(:tenant_id AS uuid) IS NULL
       OR EXISTS (SELECT 1 FROM mdm.aa_webhook_endpoint w
                  WHERE w.id = a.endpoint_id AND w.tenant_id = CAST(:tenant_id AS uuid)))
ORDER BY a.created_at DESC, a.id DESC
LIMIT :limit;

-- name: webhook_attempt_delete_before
-- Retention of the delivery log (POSTRELAY_WEBHOOK_ATTEMPT_RETENTION_DAYS), one bounded
-- batch of attempts made before :before, found by ix_webhook_attempt_endpoint_time one
-- endpoint after another (an endpoint with nothing that old costs one index probe). The
-- table has no index on created_at alone: walking the primary key for old rows instead read
-- the whole table on the last, short batch of every run.
WITH doomed AS (
    SELECT a.id
    FROM mdm.aa_webhook_endpoint e
    CROSS JOIN LATERAL (
        SELECT id FROM mdm.aa_webhook_attempt
        WHERE endpoint_id = e.id AND created_at < CAST(:before AS timestamptz)
        ORDER BY created_at
        LIMIT :batch
    ) a
    LIMIT :batch
)
DELETE FROM mdm.aa_webhook_attempt w USING doomed WHERE w.id = doomed.id;
