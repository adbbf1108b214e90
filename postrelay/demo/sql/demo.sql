-- What the demo reports: only this run's rows (created since it started) of its tenants.

-- name: demo_progress
SELECT (SELECT count(*) FROM mdm.aa_outbox_event
        WHERE tenant_id = ANY(CAST(:tenants AS uuid[])) AND created_at >= :since) AS events,
       (SELECT count(*) FROM mdm.aa_outbox_event
        WHERE tenant_id = ANY(CAST(:tenants AS uuid[])) AND created_at >= :since
          AND (handled_at IS NOT NULL OR dead_at IS NOT NULL)) AS events_settled,
       (SELECT count(*) FROM mdm.aa_job
        WHERE tenant_id = ANY(CAST(:tenants AS uuid[])) AND created_at >= :since) AS jobs,
       (SELECT count(*) FROM mdm.aa_job
        WHERE tenant_id = ANY(CAST(:tenants AS uuid[])) AND created_at >= :since
          AND status IN ('done', 'dlq', 'failed')) AS jobs_settled;

-- name: demo_job_counts
SELECT job_kind::text AS kind, status::text AS status, count(*) AS n
FROM mdm.aa_job
WHERE tenant_id = ANY(CAST(:tenants AS uuid[])) AND created_at >= :since
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: demo_email_rows
SELECT l.id, t.name AS tenant, l.template, l.status, l.to_addresses, l.smtp_code,
       l.smtp_enhanced, l.smtp_response, l.error, l.recipient_results
FROM mdm.aa_email_log l
JOIN mdm.aa_tenant t ON t.id = l.tenant_id
WHERE l.tenant_id = ANY(CAST(:tenants AS uuid[])) AND l.created_at >= :since
ORDER BY l.created_at, l.id;

-- name: demo_dead_jobs
SELECT id, job_kind::text AS kind, attempts, max_attempts, last_error
FROM mdm.aa_job
WHERE tenant_id = ANY(CAST(:tenants AS uuid[])) AND created_at >= :since
  AND status = 'dlq'
ORDER BY created_at;

-- name: demo_feedback_rows
-- What came back after the SMTP handoff, with the log row it changed and whether it
-- suppressed the address.
SELECT t.name AS tenant, l.template, l.status, l.delivery, f.recipient, f.kind, f.status AS code,
       f.diagnostic, f.source, f.suppressed OR made.feedback_id IS NOT NULL AS suppressed
FROM mdm.aa_email_feedback f
JOIN mdm.aa_email_log l ON l.id = f.email_log_id
JOIN mdm.aa_tenant t ON t.id = l.tenant_id
-- Whether the report suppressed: as in email_feedback_list (orchestrator/sql/feedback.sql).
LEFT JOIN LATERAL (SELECT s.feedback_id FROM mdm.aa_email_suppression s
                   WHERE s.feedback_id = f.id LIMIT 1) made ON true
WHERE l.tenant_id = ANY(CAST(:tenants AS uuid[])) AND f.received_at >= :since
ORDER BY t.name, f.recipient, f.received_at, f.id;
