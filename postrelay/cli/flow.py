"""Flow control: `pause` and `resume` (what is paused shows in `postrelay status`).

A scope is `--kind`, `--tenant`, both (that kind within that tenant), or `--all` (every
job). Workers claim no job of a paused scope from their next claim on; running jobs finish.
"""

from __future__ import annotations

import typer

import postrelay.queue as pq
from postrelay.cli.common import actor, transaction
from postrelay.cli.output import echo, print_json
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
