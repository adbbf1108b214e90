"""`postrelay relay` runs the outbox relay; `postrelay outbox status` shows its backlog and
`postrelay outbox replay` hands events back to it."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime

import typer

from postrelay.cli.boundary import GuardedGroup
from postrelay.cli.common import (
    actor,
    database,
    require_migrated,
    settings_or_exit,
    transaction,
    user_errors,
)
from postrelay.cli.output import echo, print_json, table
from postrelay.cli.root import app
from postrelay.core.eventloop import run
from postrelay.core.telemetry import event

outbox_app = typer.Typer(help="The transactional outbox.", no_args_is_help=True,
                         cls=GuardedGroup)
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
    event_id: str | None = typer.Option(None, "--event",
                                        help="One event id; replayed without asking."),
    since: datetime | None = typer.Option(None, "--since", help="Created at or after (UTC)."),
    until: datetime | None = typer.Option(None, "--until", help="Created before (UTC)."),
    dead: bool = typer.Option(
        False, "--dead", help="Only the events the relay gave up on (the dead events of "
                              "`outbox status`); alone, all of them."),
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant's events."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Replay without asking first."),
) -> None:
    """Re-relay one event, a time range or the dead events; no job is made twice.

    Webhook deliveries that stopped unsent (their endpoint disabled) are made again.

    Anything but one --event shows how many events match and asks first; --yes skips it.

    Without a terminal to ask on, nothing is replayed unless --yes is given.

    Each replay is logged as postrelay.cli.outbox_replay: filter, count, who ran it."""
    from postrelay.relay import outbox_replay, outbox_replay_count

    since, until = _utc(since), _utc(until)
    settings = settings_or_exit()
    with user_errors(), database(settings) as db:
        engine = db.sync_engine()
        if event_id is None:
            # Counted and replayed in two transactions: none is held open while the
            # operator reads the question.
            with engine.begin() as conn:
                matching = outbox_replay_count(conn, since=since, until=until,
                                               tenant_id=tenant, dead=dead)
            if not yes:
                _ask(matching)
        with engine.begin() as conn:
            count = outbox_replay(conn, event_id=event_id, since=since, until=until,
                                  tenant_id=tenant, dead=dead)
    # The record of the replay (there is no audit row): what was asked, by whom, how many.
    event("postrelay.cli.outbox_replay", logging.INFO, replayed=count, actor=actor(),
          tenant_id=tenant, event_id=event_id, since=since.isoformat() if since else None,
          until=until.isoformat() if until else None, dead=dead)
    echo(f"replayed {count}")


def _ask(matching: int) -> None:
    """Go on only if the operator says so; exit 1 having replayed nothing otherwise."""
    events = f"{matching:,} event{'' if matching == 1 else 's'}"
    if not sys.stdin.isatty():
        # A script or a pipe cannot answer: replaying because nobody said no is what the
        # question is there to prevent.
        typer.echo(f"error: {events} would be replayed, and stdin is not a terminal to ask "
                   "on: nothing was replayed; pass --yes to replay without asking", err=True)
        raise typer.Exit(1)
    if matching == 0:
        return  # nothing to confirm: "replayed 0" says so
    if not typer.confirm(f"{events} would be handed back to the relay. Replay them?"):
        typer.echo("nothing was replayed", err=True)
        raise typer.Exit(1)


def _utc(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value
