"""`postrelay emails [filters]` and `postrelay emails show ID`: the email log, and one
message's whole story (event → job → attempts → log rows) from one query."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import typer

from postrelay.cli.boundary import GuardedGroup
from postrelay.cli.common import actor, transaction
from postrelay.cli.output import cell, echo, print_json, table
from postrelay.cli.root import app
from postrelay.core.errors import ValidationError
from postrelay.orchestrator import (
    categories_text,
    email_list,
    email_story,
    suppression_audit,
    suppression_list,
    suppression_remove,
)

emails_app = typer.Typer(help="The email log: every message attempt and its outcome.",
                         invoke_without_command=True,
                         cls=GuardedGroup)
app.add_typer(emails_app, name="emails")

_RELATIVE = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_time(value: str | None, field: str = "since") -> datetime | None:
    """`30m`, `2h`, `7d`, or an ISO 8601 time (UTC unless it says otherwise); None when the
    option was not given. Given empty (`--since "$T"` with T unset), it is refused, not
    taken for no bound."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        raise ValidationError(field, "must be like 30m, 2h, 7d or an ISO 8601 time, not empty")
    try:
        if match := _RELATIVE.match(value):
            amount, unit = match.groups()
            return datetime.now(UTC) - timedelta(**{_UNITS[unit]: int(amount)})
        moment = datetime.fromisoformat(value)
    except OverflowError:  # a span longer than the calendar (999999d)
        raise ValidationError(field, "must be within the years 1 to 9999") from None
    except ValueError:
        raise ValidationError(field, "must be like 30m, 2h, 7d or an ISO 8601 time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@emails_app.callback()
def emails_list(
    ctx: typer.Context,
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant id."),
    recipient: str | None = typer.Option(None, "--recipient", help="Sent to this address."),
    status: str | None = typer.Option(
        None, "--status", help="sent/partial/deferred/bounced/failed/suppressed/unknown/"
        "cancelled (sending: rows written before migration 0017), or what feedback said "
        "later: delayed/delivered/soft-bounced/complained"),
    template: str | None = typer.Option(None, "--template", help="Only this template."),
    event: str | None = typer.Option(None, "--event", help="Made from this outbox event."),
    job: str | None = typer.Option(None, "--job", help="Attempts of this job."),
    since: str | None = typer.Option(None, "--since", help="30m, 2h, 7d or an ISO time."),
    until: str | None = typer.Option(None, "--until", help="Before this (same forms)."),
    limit: int = typer.Option(50, "--limit", help="At most this many (1-1000)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """The email log, newest first (`postrelay emails show ID` for one message)."""
    if ctx.invoked_subcommand is not None:
        return
    with transaction() as conn:
        rows = email_list(conn, tenant_id=tenant, recipient=recipient, status=status,
                          template=template, event_id=event, job_id=job,
                          since=parse_time(since, "since"), until=parse_time(until, "until"),
                          limit=limit)
    if as_json:
        print_json(rows)
        return
    echo(table(
        ["ID", "CREATED", "STATUS", "TEMPLATE", "TO", "SMTP", "ATTEMPT", "SUBJECT"],
        [[r["id"], r["created_at"], _status(r), r["template"], _addresses(r["to_addresses"]),
          _smtp(r), r["attempt"], r["subject"]] for r in rows],
    ) if rows else "no email log rows")


@emails_app.command("show")
def emails_show(
    log_id: str = typer.Argument(..., help="An email log row id."),
    tenant: str | None = typer.Option(None, "--tenant", help="Only if it is this tenant's."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """One message's whole story: the event, the job and its audit trail, every attempt."""
    with transaction() as conn:
        story = email_story(conn, log_id, tenant_id=tenant)
    if as_json:
        print_json(story)
        return
    log, job, event = story["log"], story["job"], story["event"]
    echo(f"message {log['message_id']}  template {log['template']} "
               f"({log['template_version'] or 'not rendered'})")
    echo(f"  from {log['from_address']}  to {_addresses(log['to_addresses'])}")
    echo(f"  subject {log['subject'] or '-'}")
    if event:
        echo(f"event {event['id']}  {event['event_type']} on {event['aggregate_type']} "
                   f"{event['aggregate_id']}  at {cell(event['created_at'])}")
    else:
        echo(f"event {log['event_id'] or '-'} (not kept)" if log["event_id"]
                   else "event - (enqueued directly)")
    if job:
        echo(f"job {job['id']}  {job['status']}  attempt {job['attempts']}/"
                   f"{job['max_attempts']}  last error: {cell(job['last_error'])}")
        for entry in story["audit"]:
            echo(f"  audit {cell(entry['created_at'])}  {entry['action']} by {entry['actor']}")
    else:
        echo(f"job {log['job_id'] or '-'} (removed by retention)")
    echo("attempts:")
    for row in story["attempts"]:
        echo(f"  #{row['attempt']} {cell(row['created_at'])}  {_status(row):<10} "
                   f"{_smtp(row)}  {cell(row['smtp_response'])}"
                   + (f"  queue id {row['queue_id']}" if row.get("queue_id") else "")
                   + (f"  error: {cell(row['error'])}" if row.get("error") else ""))
        for address, result in (row.get("recipient_results") or {}).items():
            echo(f"      {address}: {json.dumps(result)}")
    if story.get("feedback"):
        typer.echo("feedback:")
    for item in story.get("feedback") or []:
        echo(f"  {cell(item['received_at'])}  {item['kind']:<12} {item['recipient'] or '-'}  "
              f"{item['status'] or '-'}  via {item['source']}"
              + ("  suppressed" if item["suppressed"] else "")
              + (f"  {cell(item['diagnostic'])}" if item.get("diagnostic") else ""))


@emails_app.command("suppressed")
def emails_suppressed(
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant id."),
    address: str | None = typer.Option(None, "--address", help="Only this address."),
    limit: int = typer.Option(100, "--limit", help="At most this many (1-1000)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    lifted: bool = typer.Option(False, "--lifted",
                                help="Show the lifted suppressions (the audit) instead."),
) -> None:
    """Addresses not sent to any more, with why and from which source."""
    if lifted:
        _lifted(tenant, address, limit, as_json)
        return
    with transaction() as conn:
        rows = suppression_list(conn, tenant_id=tenant, address=address, limit=limit)
    if as_json:
        print_json(rows)
        return
    echo(table(["TENANT", "ADDRESS", "CATEGORY", "SINCE", "SOURCE", "REASON"],
               [[r["tenant_id"], r["address"], r["category"] or "(all)", r["created_at"],
                 r["source"] or "smtp", r["reason"]]
                      for r in rows]) if rows else "no suppressed addresses")


def _lifted(tenant: str | None, address: str | None, limit: int, as_json: bool) -> None:
    with transaction() as conn:
        rows = suppression_audit(conn, tenant_id=tenant, address=address, limit=limit)
    if as_json:
        print_json(rows)
        return
    echo(table(["TENANT", "ADDRESS", "LIFTED", "BY", "WAS"],
               [[r["tenant_id"], r["address"], r["created_at"], r["actor"],
                 "; ".join(f"{w.get('category') or '(all)'}: {w.get('reason')}"
                           for w in r["detail"].get("lifted", []))]
                for r in rows]) if rows else "no lifted suppressions")


@emails_app.command("unsuppress")
def emails_unsuppress(
    address: str = typer.Argument(..., help="The address to send to again."),
    tenant: str = typer.Option(..., "--tenant", help="The tenant id."),
    category: str | None = typer.Option(None, "--category", help="Lift the address's "
                                        "unsubscribe from this category instead (it "
                                        "subscribed again)."),
) -> None:
    """Lift a suppression: the address gets this tenant's mail again.

    Without --category, what stops all of its mail (a bounce, a complaint) is lifted;
    its unsubscribes from single categories stay until named."""
    with transaction() as conn:
        if category is not None and not category.strip():
            # `--category "$C"` with C unset lifted the bounce or complaint that stops all
            # of the address's mail, where one category's unsubscribe was meant.
            raise ValidationError("category", "must name a category, not be empty (leave "
                                              "--category out to lift what stops all mail)")
        category = category or ""
        others = suppression_remove(conn, address, tenant_id=tenant, actor=actor(),
                                    category=category)
    what = f"{category.strip()} mail" if category.strip() else "mail"
    still = f" (still suppressed in {categories_text(others)})" if others else ""
    echo(f"{address.strip().lower()} gets {what} again{still}")


def _status(row: dict[str, Any]) -> str:
    """`sent`, or `sent → bounced` once feedback said more."""
    return f"{row['status']} → {row['delivery']}" if row.get("delivery") else row["status"]


def _addresses(addresses: list[str | None]) -> str:
    """A row's addresses, a NULL among them (SQL written by hand: postrelay writes none) as
    "-": joined as it was, it failed the whole listing."""
    return ", ".join("-" if address is None else address for address in addresses)


def _smtp(row: dict[str, Any]) -> str:
    if row.get("smtp_code") is None:
        return "-"
    return f"{row['smtp_code']} {row.get('smtp_enhanced') or ''}".strip()
