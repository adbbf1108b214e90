"""The dashboard's reads: one thin function per statement of sql/dashboard.sql.

Every function takes the caller's Connection and a `tenant_id` scope (None: every tenant),
and never commits. Writes are not here: the routes call the queue, cron and relay modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from postrelay.core.dbcall import Rows
from postrelay.core.sqlfiles import load_queries
from postrelay.queue import STATUSES

DASHBOARD_SQL = load_queries("postrelay.dashboard", "sql/dashboard.sql")

# orchestrator.schema.EMAIL_STATUSES in the order the dashboard shows them.
EMAIL_STATUSES = ("sent", "partial", "deferred", "bounced", "failed", "suppressed",
                  "sending", "unknown", "cancelled")
FINISHED = ("done", "failed", "dlq")
# The statuses the overview counts exactly, per kind and per tenant. `done` is the history:
# the overview shows the last hour of it (the chart) and an estimate of the rest.
COUNTED = tuple(s for s in STATUSES if s != "done")
PAGE_SIZE = 50
# Pages of a listing, at most: OFFSET reads every row it skips. Older rows are found by
# narrowing the time range instead.
MAX_PAGE = 200


@dataclass(frozen=True, slots=True)
class JobCounts:
    """Jobs not done, by status, by kind and status, by tenant and status (zeros left out,
    except in `by_status`, which has every status of COUNTED)."""

    by_status: Mapping[str, int]
    by_kind: Mapping[str, Mapping[str, int]]
    by_tenant: Mapping[UUID, Mapping[str, int]]

    @property
    def total(self) -> int:
        return sum(self.by_status.values())


@dataclass(frozen=True, slots=True)
class Overview:
    counts: JobCounts
    due: int
    oldest_due_secs: float | None
    minutes: list[tuple[datetime, int, int]]  # (minute, done, failed or dead), oldest first
    outbox_backlog: int
    outbox_lag_secs: float | None
    outbox_dead: int
    emails: Mapping[str, int] = field(default_factory=dict)  # last 24 hours, by status
    # Done jobs kept, as the table statistics last counted them; None for a tenant session
    # (the statistics are not per tenant) or before the first VACUUM or ANALYZE.
    done_estimate: int | None = None

    @property
    def done_last_hour(self) -> int:
        """The chart's minutes, this one and the 59 before it: closed minutes from the
        done rollup (queue/maintenance/rollup.py), the last minute or so counted live."""
        return sum(done for _, done, _ in self.minutes)


def job_counts(conn: Connection, tenant_id: UUID | None) -> JobCounts:
    """Exact counts of the jobs that are not done. Their cost does not grow with history."""
    by_status = dict.fromkeys(COUNTED, 0)
    by_kind: dict[str, dict[str, int]] = {}
    by_tenant: dict[UUID, dict[str, int]] = {}
    for row in conn.execute(DASHBOARD_SQL["job_count_live"], {"tenant_id": tenant_id}):
        by_status[row.status] += row.n
        kind = by_kind.setdefault(row.kind, {})
        kind[row.status] = kind.get(row.status, 0) + row.n
        tenant = by_tenant.setdefault(row.tenant_id, {})
        tenant[row.status] = tenant.get(row.status, 0) + row.n
    return JobCounts(by_status, by_kind, by_tenant)


def email_counts(conn: Connection, tenant_id: UUID | None, *, since: datetime) -> dict[str, int]:
    """Email log rows created since `since`, by status, every status named."""
    if tenant_id is None:
        return dict(conn.execute(DASHBOARD_SQL["email_log_count_since"], {
            "since": since, "statuses": list(EMAIL_STATUSES)}).all())
    found: dict[str, int] = dict(conn.execute(DASHBOARD_SQL["email_log_count_since_tenant"], {
        "since": since, "tenant_id": tenant_id}).all())
    return {status: found.get(status, 0) for status in EMAIL_STATUSES}


def job_done_estimate(conn: Connection) -> int | None:
    """Done jobs in all, from the table statistics (None before they counted any)."""
    n = int(conn.execute(DASHBOARD_SQL["job_done_estimate"]).scalar_one())
    return n if n > 0 else None


def overview(conn: Connection, tenant_id: UUID | None, *, minutes: int = 60) -> Overview:
    """Everything on the overview page, in eight statements that each read an index (or the
    catalogue) and none of which reads the done history beyond the minutes the done
    rollup has not tallied yet (normally the last minute or so)."""
    scope = {"tenant_id": tenant_id}
    counts = job_counts(conn, tenant_id)
    pending = conn.execute(DASHBOARD_SQL["job_pending_oldest"], scope).one()
    this_minute: datetime = pending.this_minute
    since = this_minute - timedelta(minutes=minutes - 1)
    until = conn.execute(DASHBOARD_SQL["job_done_rollup_until"]).scalar_one()
    done: dict[datetime, int] = {minute: n for minute, n in conn.execute(
        DASHBOARD_SQL["job_done_per_minute"], {**scope, "since": since, "until": until})}
    failed: dict[datetime, int] = {minute: n for minute, n in conn.execute(
        DASHBOARD_SQL["job_failed_per_minute"], {**scope, "since": since})}
    series = [(m, done.get(m, 0), failed.get(m, 0))
              for m in (since + timedelta(minutes=i) for i in range(minutes))]
    outbox = conn.execute(DASHBOARD_SQL["outbox_backlog"], scope).one()
    emails = email_counts(conn, tenant_id, since=this_minute - timedelta(hours=24))
    done_estimate = job_done_estimate(conn) if tenant_id is None else None
    if done_estimate is not None:
        # The statistics lag: never claim fewer in all than the last hour's exact count.
        done_estimate = max(done_estimate, sum(d for _, d, _ in series))
    return Overview(counts, pending.due, pending.oldest_age_secs, series, outbox.backlog,
                    outbox.lag_secs, outbox.dead, emails, done_estimate)


def job_list(conn: Connection, *, status: str, tenant_id: UUID | None, kind: str | None,
             since: datetime | None, until: datetime | None, page: int) -> Rows:
    """One page of jobs in one status, in that status's natural order (see the SQL)."""
    params = {"tenant_id": tenant_id, "kind": kind, "since": since, "until": until,
              "limit": PAGE_SIZE + 1, "offset": (page - 1) * PAGE_SIZE}
    if status == "pending":
        return conn.execute(DASHBOARD_SQL["job_list_pending"], params).all()
    if status == "running":
        return conn.execute(DASHBOARD_SQL["job_list_running"], params).all()
    return conn.execute(DASHBOARD_SQL["job_list_finished"], {**params, "status": status}).all()


def job_find_by_key(conn: Connection, key: str, tenant_id: UUID | None) -> Rows:
    return conn.execute(DASHBOARD_SQL["job_find_by_key"],
                        {"key": key, "tenant_id": tenant_id}).all()


def job_audit(conn: Connection, job_id: UUID, tenant_id: UUID | None) -> Rows:
    return conn.execute(DASHBOARD_SQL["job_audit_list"],
                        {"job_id": job_id, "tenant_id": tenant_id}).all()


def job_origin(conn: Connection, job_id: UUID, tenant_id: UUID | None) -> Rows:
    """The outbox deliveries that made this job, with events of the job's tenant only."""
    return conn.execute(DASHBOARD_SQL["job_origin"],
                        {"job_id": job_id, "tenant_id": tenant_id}).all()


def dlq_matching(conn: Connection, *, tenant_id: UUID | None, kind: str | None,
                 since: datetime | None, until: datetime | None, limit: int) -> Rows:
    return conn.execute(DASHBOARD_SQL["dlq_list_matching"], {
        "tenant_id": tenant_id, "kind": kind, "since": since, "until": until, "limit": limit,
    }).all()


def dlq_count(conn: Connection, *, tenant_id: UUID | None, kind: str | None,
              since: datetime | None, until: datetime | None) -> int:
    return int(conn.execute(DASHBOARD_SQL["dlq_count_matching"], {
        "tenant_id": tenant_id, "kind": kind, "since": since, "until": until,
    }).scalar_one())


def api_key_by_hash(conn: Connection, digest: str) -> Any:
    return conn.execute(DASHBOARD_SQL["api_key_find_by_hash"], {"key_hash": digest}).first()


def api_key_active(conn: Connection, key_id: UUID) -> Any:
    return conn.execute(DASHBOARD_SQL["api_key_get_active"], {"id": key_id}).first()


def job_emails(conn: Connection, job_id: UUID, tenant_id: UUID | None) -> Rows:
    """The email log rows of a job."""
    return conn.execute(DASHBOARD_SQL["email_log_of_job"],
                        {"job_id": job_id, "tenant_id": tenant_id}).all()


def dlq_by_ids(conn: Connection, ids: list[UUID], tenant_id: UUID | None) -> Rows:
    return conn.execute(DASHBOARD_SQL["dlq_list_ids"], {"ids": ids, "tenant_id": tenant_id}).all()


def dlq_lock_ids(conn: Connection, ids: list[UUID],
                 tenant_id: UUID | None) -> dict[UUID, datetime | None]:
    """Of `ids`, the jobs still dead, each with when it was dead-lettered; locked."""
    rows = conn.execute(DASHBOARD_SQL["dlq_lock_ids"], {"ids": ids, "tenant_id": tenant_id})
    return {row.id: row.at for row in rows}
