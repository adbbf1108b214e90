"""`postrelay cron add|list|rm`: cron entries (there is no update: remove and add again)."""

from __future__ import annotations

import json

import typer

from postrelay.cli.boundary import GuardedGroup
from postrelay.cli.common import actor, transaction
from postrelay.cli.output import echo, print_json, table
from postrelay.cli.root import app
from postrelay.core import jsontext
from postrelay.orchestrator import check_job_payload
from postrelay.queue import SYSTEM_TENANT_ID, cron_create, cron_delete, cron_list

cron_app = typer.Typer(help="Cron entries: each firing enqueues one job (times in UTC).",
                       no_args_is_help=True,
                       cls=GuardedGroup)
app.add_typer(cron_app, name="cron")


@cron_app.command("add")
def cron_add(
    name: str = typer.Argument(..., help="Unique per tenant; 'postrelay.*' is the system's."),
    schedule: str = typer.Argument(..., help="'min hour day month weekday', or seconds first."),
    kind: str = typer.Argument(..., help="The job kind each firing enqueues."),
    payload: str = typer.Option("{}", "--payload", help="JSON object, frozen at creation."),
    tenant: str = typer.Option(str(SYSTEM_TENANT_ID), "--tenant", help="Owning tenant id."),
    priority: int = typer.Option(100, "--priority",
                                 help="Each firing's job priority (lower runs first)."),
    max_attempts: int | None = typer.Option(
        None, "--max-attempts", help="Each firing's job attempts.",
        show_default="POSTRELAY_JOB_MAX_RETRIES"),
) -> None:
    """Create a cron entry. A system kind (cleanup_jobs) runs only in the system tenant.

    An email_send payload is checked as enqueue_email checks a message."""
    with transaction() as conn:
        body = jsontext.parse_document(payload, "payload")
        check_job_payload(kind, body)
        entry = cron_create(conn, name, schedule, kind, body, tenant_id=tenant,
                            priority=priority, max_attempts=max_attempts, created_by=actor())
    echo(f"created {entry.name}: '{entry.schedule}' -> {entry.kind}")


@cron_app.command("list")
def cron_list_command(
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant's entries."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Every cron entry with its last and next run, and why its firings fail, if they do.

    FAILING_SINCE and LAST_ERROR stay empty while its firings succeed."""
    with transaction() as conn:
        entries = cron_list(conn, tenant_id=tenant)
    if as_json:
        print_json(entries)
        return
    # Names are per tenant, so the tenant is part of what names an entry.
    rows = [[e.name, e.tenant_id, e.schedule, e.kind, e.last_run, e.next_run,
             e.failing_since, e.last_error, json.dumps(e.payload)] for e in entries]
    echo(table(["NAME", "TENANT", "SCHEDULE", "KIND", "LAST_RUN", "NEXT_RUN", "FAILING_SINCE",
                "LAST_ERROR", "PAYLOAD"], rows)
         if rows else "no cron entries")


@cron_app.command("rm")
def cron_rm(
    name: str = typer.Argument(..., help="The entry's name."),
    tenant: str | None = typer.Option(
        None, "--tenant", help="The entry's tenant id; needed when several tenants have an "
                               "entry of this name."),
) -> None:
    """Delete a cron entry by name; it never fires again.

    The built-in postrelay.* entries are not deleted this way."""
    with transaction() as conn:
        cron_delete(conn, name, tenant_id=tenant, actor=actor())
    echo(f"deleted {name}")
