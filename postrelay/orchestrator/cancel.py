"""Cancelling jobs, with the email log told: the queue's cancel (queue/admin.py) plus a
`cancelled` log row for every `email_send` job cancelled before it ran, in the same
transaction. The CLI, the HTTP API and the dashboard cancel through here."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from sqlalchemy import Connection

import postrelay.queue as pq
from postrelay.orchestrator.job import EMAIL_KIND
from postrelay.orchestrator.queries import EMAIL_SQL
from postrelay.queue import Cancelled


def cancel_job(conn: Connection, job_id: UUID | str, *, actor: str,
               tenant_id: UUID | str | None = None) -> Cancelled:
    """The queue's job_cancel, and the email log row."""
    cancelled = pq.job_cancel(conn, job_id, actor=actor, tenant_id=tenant_id)
    _log_cancelled(conn, [cancelled])
    return cancelled


def cancel_jobs(conn: Connection, *, actor: str, **filters: Any) -> list[Cancelled]:
    """The queue's jobs_cancel, and the email log rows."""
    cancelled = pq.jobs_cancel(conn, actor=actor, **filters)
    _log_cancelled(conn, cancelled)
    return cancelled


def _log_cancelled(conn: Connection, cancelled: list[Cancelled]) -> None:
    ids = [c.id for c in cancelled if c.kind == EMAIL_KIND and c.was == "pending"]
    if ids:
        conn.execute(EMAIL_SQL["email_log_cancelled"], {"ids": ids})
