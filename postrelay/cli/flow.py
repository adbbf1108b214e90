"""Flow control: `pause`, `resume` (what is paused shows in `postrelay status`) and
`limits set|list|rm` (`list` also shows the destinations throttled after refusing work).

A scope is `--kind`, `--tenant`, both (that kind within that tenant), or `--all` (every
job). Workers claim no job of a paused scope from their next claim on; running jobs finish.
"""

from __future__ import annotations

import typer

import postrelay.queue as pq
from postrelay.cli.boundary import GuardedGroup
from postrelay.cli.common import actor, transaction
from postrelay.cli.output import echo, print_json, table
from postrelay.cli.root import app

KIND_OPT = typer.Option(None, "--kind", help="Only jobs of this kind.")
TENANT_OPT = typer.Option(None, "--tenant", help="Only this tenant's jobs (tenant id).")
ALL_OPT = typer.Option(False, "--all", help="Every job of every kind and tenant.")


@app.command("pause")
def pause_command(kind: str | None = KIND_OPT, tenant: str | None = TENANT_OPT,
                  everything: bool = ALL_OPT,
                  as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Stop workers claiming jobs of a kind, a tenant, a kind within a tenant, or all.

    Paused jobs stay pending with their attempts; running ones finish."""
    with transaction() as conn:
        found, created = pq.pause(conn, actor=actor(), kind=kind, tenant_id=tenant,
                                  everything=everything)
    if as_json:
        print_json({"pause": found, "created": created})
        return
    if created:
        echo(f"paused {found.describe()}")
    else:
        echo(f"already paused {found.describe()} (by {found.paused_by} since "
             f"{found.paused_at.isoformat(timespec='seconds')})")


@app.command("resume")
def resume_command(kind: str | None = KIND_OPT, tenant: str | None = TENANT_OPT,
                   everything: bool = ALL_OPT) -> None:
    """Lift the pause of exactly this scope; workers claim its jobs again at once."""
    with transaction() as conn:
        found = pq.resume(conn, actor=actor(), kind=kind, tenant_id=tenant,
                          everything=everything)
    echo(f"resumed {found.describe()} (paused by {found.paused_by})")


limits_app = typer.Typer(help="Rate and concurrency limits, enforced in the claim by every "
                              "worker.", no_args_is_help=True,
                         cls=GuardedGroup)
app.add_typer(limits_app, name="limits")


@limits_app.command("set")
def limits_set(
    kind: str = typer.Option(..., "--kind", help="The job kind it limits."),
    tenant: str | None = typer.Option(None, "--tenant",
                                      help="Only this tenant's jobs (its own limit)."),
    rate: str | None = typer.Option(None, "--rate", help="Claims per second, minute or hour: "
                                                         "14/s, 1000/min, 3600/h."),
    burst: int | None = typer.Option(None, "--burst",
                                     help="Claims at once on top of the rate (default: one "
                                          "second's worth)."),
    concurrency: int | None = typer.Option(None, "--concurrency",
                                           help="At most this many running at once."),
    key: str | None = typer.Option(None, "--key", help="Limit each value of this payload "
                                                       "field apart (dots for nested)."),
) -> None:
    """Set (or replace) the limit of a kind, optionally within a tenant."""
    with transaction() as conn:
        found = pq.limit_set(conn, actor=actor(), kind=kind, tenant_id=tenant, rate=rate,
                             burst=burst, concurrency=concurrency, key=key)
    echo(f"limit set: {found.describe()}")


@limits_app.command("list")
def limits_list(
    as_json: bool = typer.Option(False, "--json", help="Print JSON: the limits, or with "
                                                       "--throttled the throttled destinations."),
    only_throttled: bool = typer.Option(False, "--throttled",
                                        help="Only the destinations throttled now."),
) -> None:
    """Every limit, and the destinations throttled now after refusing work."""
    with transaction() as conn:
        found = [] if only_throttled else pq.limit_list(conn)
        throttled = pq.throttle_list(conn)
    if as_json:
        print_json(throttled if only_throttled else found)
        return
    rows = [[f.kind, f.tenant_id or "(every tenant)", f.key or "-",
             "-" if f.rate_per_sec is None else f"{f.rate_per_sec:g}/s",
             "-" if f.burst is None else f.burst,
             "-" if f.concurrency is None else f.concurrency, f.created_by, f.created_at]
            for f in found]
    if not only_throttled:
        echo(table(["KIND", "TENANT", "KEY", "RATE", "BURST", "CONCURRENCY", "BY", "SINCE"],
                   rows) if rows else "no limits")
    if only_throttled and not throttled:
        echo("no destination is throttled")
    if throttled:
        echo("\nthrottled (refused by the destination; every worker slows down):")
        echo(table(["DESTINATION", "RATE NOW", "BACK TO", "SINCE", "PAUSED UNTIL", "UNTIL",
                    "REFUSALS", "WHY"],
                   [[t.destination, "paused" if t.rate_now == 0 else f"{t.rate_now:.3g}/s",
                     "unlimited" if t.recovers_to is None else f"{t.recovers_to:g}/s",
                     t.started_at, t.paused_until, t.ends_at, t.refusals, t.reason]
                    for t in throttled]))


@limits_app.command("rm")
def limits_rm(
    kind: str = typer.Option(..., "--kind", help="The job kind."),
    tenant: str | None = typer.Option(None, "--tenant", help="The tenant's own limit."),
) -> None:
    """Remove the limit of exactly this kind (and tenant)."""
    with transaction() as conn:
        found = pq.limit_remove(conn, actor=actor(), kind=kind, tenant_id=tenant)
    echo(f"limit removed: {found.describe()}")
