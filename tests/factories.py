"""Build any row state directly, so tests of rescue, retention and the DLQ need no waiting."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, text

TABLES_TO_CLEAN = ("mdm.aa_job", "mdm.aa_job_audit", "mdm.aa_worker", "mdm.aa_lease",
                   "mdm.aa_outbox_event", "mdm.aa_outbox_delivery", "mdm.aa_cron_audit",
                   "mdm.aa_email_log", "mdm.aa_email_suppression",
                   "mdm.aa_email_feedback", "mdm.aa_job_cancel", "mdm.aa_job_pause",
                   "mdm.aa_flow_audit", "mdm.aa_job_limit", "mdm.aa_job_limit_bucket",
                   "mdm.aa_job_done_minute", "mdm.aa_job_done_rollup", "mdm.aa_job_throttle",
                   "mdm.aa_feedback_inbox", "mdm.aa_email_hour", "mdm.aa_email_hour_rollup")


def insert_job(
    conn: Connection,
    *,
    tenant_id: uuid.UUID,
    kind: str = "reindex",
    status: str = "pending",
    payload: dict[str, Any] | None = None,
    priority: int = 100,
    attempts: int = 0,
    max_attempts: int = 8,
    available_at: datetime | None = None,
    claimed_by: str | None = None,
    claimed_at: datetime | None = None,
    completed_at: datetime | None = None,
    last_error: str | None = None,
    idempotency_key: str | None = None,
) -> uuid.UUID:
    row = conn.execute(
        text(
            """
            INSERT INTO mdm.aa_job (tenant_id, job_kind, status, payload, priority, attempts,
                max_attempts, available_at, claimed_by, claimed_at, completed_at, last_error,
                idempotency_key)
            VALUES (:tenant_id, CAST(:kind AS mdm.job_kind), CAST(:status AS mdm.job_status),
                CAST(:payload AS jsonb), :priority, :attempts, :max_attempts,
                COALESCE(:available_at, now()), :claimed_by, :claimed_at, :completed_at,
                :last_error, :idempotency_key)
            RETURNING id
            """
        ),
        {
            "tenant_id": tenant_id,
            "kind": kind,
            "status": status,
            "payload": json.dumps(payload or {}),
            "priority": priority,
            "attempts": attempts,
            "max_attempts": max_attempts,
            "available_at": available_at,
            "claimed_by": claimed_by,
            "claimed_at": claimed_at,
            "completed_at": completed_at,
            "last_error": last_error,
            "idempotency_key": idempotency_key,
        },
    ).scalar_one()
    return row


def job_row(conn: Connection, job_id: uuid.UUID) -> dict[str, Any]:
    row = conn.execute(
        text("SELECT *, job_kind::text AS kind, status::text AS state "
             "FROM mdm.aa_job WHERE id = :id"),
        {"id": job_id},
    ).mappings().one()
    return dict(row)


def audit_rows(conn: Connection, job_id: uuid.UUID) -> list[dict[str, Any]]:
    rows = conn.execute(
        text("SELECT action, actor, detail FROM mdm.aa_job_audit WHERE job_id = :id ORDER BY id"),
        {"id": job_id},
    ).mappings().all()
    return [dict(r) for r in rows]


def scalar(engine: Engine, sql: str, **params: Any) -> Any:
    """The one value `sql` selects, read on a connection of its own."""
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar_one()


def insert_throttle(conn: Connection, *, kind: str = "email_send",
                    key_path: list[str] | None = None, key: str = "",
                    tenant_id: uuid.UUID | None = None, reason: str = "454 4.7.0 slow down",
                    rate: float = 7.0, ceiling: float | None = 14.0,
                    paused_secs: float = 5.0, ends_in_secs: float = 15.0) -> None:
    """A destination throttled now (as queue/throttles.py leaves one after a refusal)."""
    conn.execute(text(
        "INSERT INTO mdm.aa_job_throttle (job_kind, key_path, key, tenant_id, rate_per_sec,"
        " ceiling_per_sec, step_secs, paused_until, ends_at, tokens, refilled_at, reason)"
        " VALUES (CAST(:kind AS mdm.job_kind), :key_path, :key, :tenant_id, :rate, :ceiling,"
        " 10, now() + make_interval(secs => :paused), now() + make_interval(secs => :ends),"
        " 1, now() + make_interval(secs => :paused), :reason)"),
        {"kind": kind, "key_path": key_path, "key": key, "tenant_id": tenant_id, "rate": rate,
         "ceiling": ceiling, "paused": paused_secs, "ends": ends_in_secs, "reason": reason})


def insert_attempt(conn: Connection, endpoint_id: uuid.UUID, *,
                   event_id: uuid.UUID | None = None, attempt: int = 1,
                   status_code: int | None = 200, response_body: str | None = "ok",
                   error: str | None = None, ago_secs: float = 0.0) -> uuid.UUID:
    """One delivery attempt in the webhook log (as the handler records one); returns its
    event's id."""
    event_id = event_id or uuid.uuid4()
    conn.execute(text(
        "INSERT INTO mdm.aa_webhook_attempt (job_id, endpoint_id, event_id, attempt,"
        " status_code, duration_ms, response_body, error, created_at)"
        " VALUES (:job, :endpoint, :event, :attempt, :status, 12, :body, :error,"
        " now() - make_interval(secs => :ago))"),
        {"job": uuid.uuid4(), "endpoint": endpoint_id, "event": event_id, "attempt": attempt,
         "status": status_code, "body": response_body, "error": error, "ago": ago_secs})
    return event_id
