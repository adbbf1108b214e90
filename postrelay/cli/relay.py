"""`postrelay relay` runs the outbox relay; `postrelay outbox status` shows its backlog."""

from __future__ import annotations

from datetime import UTC, datetime

import typer

from postrelay.cli.common import database, require_migrated, settings_or_exit, transaction
from postrelay.cli.output import echo, print_json, table
from postrelay.cli.root import app
from postrelay.core.eventloop import run

outbox_app = typer.Typer(help="The transactional outbox.", no_args_is_help=True)
app.add_typer(outbox_app, name="outbox")


@app.command("relay")
def relay_command(
    apps: list[str] = typer.Option(
        [], "--app", help="Module that registers routes with @postrelay.relay.route (repeatable)."
    ),
) -> None:
    """Relay outbox events into jobs until SIGTERM or SIGINT."""
    from postrelay.runtime import build_relay, import_apps, run_until_signalled

    settings = settings_or_exit()
    import_apps(apps)
    with database(settings) as db:
        require_migrated(db)
        run(run_until_signalled(build_relay(settings, db)))


@outbox_app.command("status")
def outbox_status(
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant's events."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Backlog, relay lag (age of the oldest unhandled event) and dead events."""
    from postrelay.relay import outbox_status as read_status

    with transaction() as conn:
        status = read_status(conn, tenant_id=tenant)
    if as_json:
        print_json(status)
        return
    lag = "-" if status.lag_secs is None else f"{status.lag_secs:.3f} s"
    echo(table(["BACKLOG", "RETRYING", "LAG", "HANDLED", "DEAD"],
                     [[status.backlog, status.retrying, lag, status.handled, status.dead]]))
    if status.dead_events:
        echo("\ndead events:")
        echo(table(["ID", "EVENT_TYPE", "AGGREGATE", "ATTEMPTS", "LAST_ERROR"],
                         [[e["id"], e["event_type"],
                           f"{e['aggregate_type']}/{e['aggregate_id']}", e["attempts"],
                           e["last_error"]] for e in status.dead_events]))


@outbox_app.command("replay")
def outbox_replay_command(
    event_id: str | None = typer.Option(None, "--event", help="One event id."),
    since: datetime | None = typer.Option(None, "--since", help="Created at or after (UTC)."),
    until: datetime | None = typer.Option(None, "--until", help="Created before (UTC)."),
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant's events."),
) -> None:
    """Re-relay one event or a time range; jobs that exist are not created twice.

    Webhook deliveries that stopped unsent (their endpoint disabled) are made again."""
    from postrelay.relay import outbox_replay

    with transaction() as conn:
        count = outbox_replay(conn, event_id=event_id, since=_utc(since), until=_utc(until),
                              tenant_id=tenant)
    echo(f"replayed {count}")


def _utc(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value
