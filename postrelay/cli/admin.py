"""Operator commands: `status`, `jobs`, `dlq` and `tenants`.

Each command runs in one transaction and prints a plain-text table, or JSON with `--json`.
Mutations are audited with the actor `cli:<os user>@<host>`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime
from uuid import UUID

import typer
from sqlalchemy import Connection

# The queue's operator functions, as the package exports them (`admin.job_list`, ...).
import postrelay.queue as admin
from postrelay.cli.boundary import GuardedGroup
from postrelay.cli.common import actor, transaction
from postrelay.cli.output import cell, echo, jsonable, print_json, table
from postrelay.cli.root import app
from postrelay.orchestrator import cancel_job, cancel_jobs
from postrelay.queue import ensure_tenant

jobs_app = typer.Typer(help="Read and cancel jobs.", no_args_is_help=True,
                       cls=GuardedGroup)
dlq_app = typer.Typer(help="The dead-letter queue: list, retry, requeue, discard.",
                      no_args_is_help=True,
                      cls=GuardedGroup)
tenants_app = typer.Typer(help="Tenants: every job belongs to one.", no_args_is_help=True,
                          cls=GuardedGroup)
app.add_typer(jobs_app, name="jobs")
app.add_typer(dlq_app, name="dlq")
app.add_typer(tenants_app, name="tenants")

JSON_OPT = typer.Option(False, "--json", help="Print JSON instead of a table.")
TENANT_OPT = typer.Option(None, "--tenant", help="Only this tenant's jobs (tenant id).")


@app.command("status")
def status_command(as_json: bool = JSON_OPT) -> None:
    """Job counts by status, kind and tenant, and how late the due backlog is."""
    with transaction() as conn:
        status = admin.queue_status(conn)
        names = _tenant_names(conn)
        pauses = admin.pause_list(conn)
    if as_json:
        print_json({**dataclasses.asdict(status), "paused": pauses})
        return
    due_age = status.oldest_due_age_secs
    echo(table(["STATUS", "JOBS"], list(status.by_status.items())))
    echo(f"\ndue pending: {status.due_pending}   oldest due waiting: "
               + ("-" if due_age is None else f"{due_age:.1f} s"))
    by_tenant = {names.get(t, str(t)): counts for t, counts in status.by_tenant.items()}
    for title, groups in (("KIND", status.by_kind), ("TENANT", by_tenant)):
        if groups:
            rows = [[label, *(groups[label].get(s, 0) for s in admin.STATUSES)]
                    for label in sorted(groups)]
            echo("\n" + table([title, *(s.upper() for s in admin.STATUSES)], rows))
    if pauses:
        rows = [[p.kind or "(every kind)",
                 "(every tenant)" if p.tenant_id is None else names.get(p.tenant_id, p.tenant_id),
                 p.paused_at, p.paused_by] for p in pauses]
        echo("\nPAUSED (workers claim none of these)\n"
             + table(["KIND", "TENANT", "SINCE", "BY"], rows))


@jobs_app.command("list")
def jobs_list(
    status: str | None = typer.Option(None, "--status", help="pending/running/done/failed/dlq"),
    kind: str | None = typer.Option(None, "--kind", help="Only this job kind."),
    tenant: str | None = TENANT_OPT,
    limit: int = typer.Option(50, "--limit", help="At most this many (1-500)."),
    as_json: bool = JSON_OPT,
) -> None:
    """Jobs, newest first."""
    _print_jobs(lambda conn: admin.job_list(conn, status=status, kind=kind, tenant_id=tenant,
                                            limit=limit), as_json)


@jobs_app.command("show")
def jobs_show(
    job_id: str = typer.Argument(..., help="The job id."),
    tenant: str | None = TENANT_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Every field of one job."""
    with transaction() as conn:
        job = admin.job_get(conn, job_id, tenant_id=tenant)
    if job is None:
        echo(f"error: no job {job_id}", err=True)
        raise typer.Exit(1)
    if as_json:
        print_json(job)
        return
    for name, value in dataclasses.asdict(job).items():
        shown = json.dumps(jsonable(value), indent=2) if name == "payload" else \
            cell(value, truncate=False)
        echo(f"{name + ':':<17}{shown}")


@dlq_app.command("list")
def dlq_list(
    tenant: str | None = TENANT_OPT,
    limit: int = typer.Option(50, "--limit", help="At most this many (1-500)."),
    as_json: bool = JSON_OPT,
) -> None:
    """Dead jobs, the most recently dead-lettered first."""
    _print_jobs(lambda conn: admin.dlq_list(conn, tenant_id=tenant, limit=limit), as_json)


@dlq_app.command("retry")
def dlq_retry(
    job_id: str = typer.Argument(..., help="The dead job's id."),
    tenant: str | None = TENANT_OPT,
) -> None:
    """Give one dead job exactly one more attempt (its attempts are kept)."""
    with transaction() as conn:
        job = admin.dlq_retry(conn, job_id, actor=actor(), tenant_id=tenant)
    echo(f"retried {job.id} (attempts so far {job.attempts}/{job.max_attempts})")


@dlq_app.command("requeue")
def dlq_requeue(
    tenant: str | None = TENANT_OPT,
    limit: int = typer.Option(1000, "--limit", help="At most this many (1-1000)."),
) -> None:
    """Send dead jobs back to pending, oldest first, at most 1000 per call."""
    with transaction() as conn:
        count = admin.dlq_requeue(conn, actor=actor(), tenant_id=tenant, limit=limit)
    echo(f"requeued {count}")


@dlq_app.command("discard")
def dlq_discard(
    job_id: str = typer.Argument(..., help="The dead job's id."),
    tenant: str | None = TENANT_OPT,
) -> None:
    """Delete one dead job; its audit row keeps a copy of it."""
    with transaction() as conn:
        admin.dlq_discard(conn, job_id, actor=actor(), tenant_id=tenant)
    echo(f"discarded {job_id}")


@tenants_app.command("add")
def tenants_add(name: str = typer.Argument(..., help="The tenant's unique name.")) -> None:
    """Create a tenant (or find the existing one of that name) and print its id."""
    with transaction() as conn:
        tenant_id = ensure_tenant(conn, name)
    echo(str(tenant_id))


@tenants_app.command("list")
def tenants_list(as_json: bool = JSON_OPT) -> None:
    """Every tenant, by name."""
    with transaction() as conn:
        tenants = admin.tenant_list(conn)
    if as_json:
        print_json(tenants)
        return
    rows = [[t.id, t.name, t.created_at] for t in tenants]
    echo(table(["ID", "NAME", "CREATED_AT"], rows))


def _print_jobs(fetch: Callable[[Connection], list[admin.JobView]], as_json: bool) -> None:
    with transaction() as conn:
        jobs = fetch(conn)
        names = _tenant_names(conn) if jobs and not as_json else {}
    if as_json:
        print_json(jobs)
        return
    headers = ["ID", "TENANT", "KIND", "STATUS", "ATTEMPTS", "PRIO", "AVAILABLE_AT",
               "CREATED_AT", "LAST_ERROR"]
    rows = [
        [j.id, names.get(j.tenant_id, j.tenant_id), j.kind, j.status,
         f"{j.attempts}/{j.max_attempts}", j.priority, j.available_at, j.created_at,
         _error_summary(j.last_error)]
        for j in jobs
    ]
    echo(table(headers, rows) if rows else "no jobs")


def _tenant_names(conn: Connection) -> dict[UUID, str]:
    return {t.id: t.name for t in admin.tenant_list(conn)}


def _error_summary(error: str | None) -> str | None:
    # A traceback's last line names the exception and its message: the part that fits.
    # Split on newlines only: splitlines() also splits on \r and other controls, which
    # would let a message hide what precedes them.
    lines = [line for line in (error or "").split("\n") if line.strip()]
    return lines[-1].strip() if lines else error




@jobs_app.command("cancel")
def jobs_cancel(
    job_id: str | None = typer.Argument(None, help="The job's id; omit to cancel by filter."),
    kind: str | None = typer.Option(None, "--kind", help="Only this job kind."),
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant's jobs."),
    created_from: datetime | None = typer.Option(None, "--created-from",
                                                 help="Created at or after (UTC if no zone)."),
    created_to: datetime | None = typer.Option(None, "--created-to",
                                               help="Created before (UTC if no zone)."),
    event_id: str | None = typer.Option(None, "--event", help="Made from this outbox event."),
    template: str | None = typer.Option(None, "--template",
                                        help="email_send jobs of this template."),
    limit: int = typer.Option(1000, "--limit", help="At most this many (1-1000)."),
) -> None:
    """Cancel one pending or running job, or up to 1000 matching the filters.

    A cancelled job becomes failed; a running one's handler is stopped within a second."""
    with transaction() as conn:
        if job_id is not None:
            done = cancel_job(conn, job_id, actor=actor(), tenant_id=tenant)
            typer.echo(f"cancelled {done.id} (was {done.was})")
            return
        cancelled = cancel_jobs(conn, actor=actor(), tenant_id=tenant, kind=kind,
                                created_from=_utc(created_from), created_to=_utc(created_to),
                                event_id=event_id, template=template, limit=limit)
    typer.echo(f"cancelled {len(cancelled)}")


def _utc(value: datetime | None) -> datetime | None:
    return value if value is None or value.tzinfo else value.replace(tzinfo=UTC)
