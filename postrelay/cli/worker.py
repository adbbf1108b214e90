"""`postrelay worker`: run jobs until SIGTERM."""

from __future__ import annotations

from uuid import UUID

import typer

from postrelay.cli.common import database, require_migrated, settings_or_exit
from postrelay.cli.root import app
from postrelay.core.eventloop import run


@app.command("worker")
def worker_command(
    apps: list[str] = typer.Option(
        [], "--app",
        help="Module that registers handlers with @postrelay.queue.handler (repeatable).",
    ),
    # The setting's bound too: past it, the option was taken as it came.
    concurrency: int | None = typer.Option(
        None, min=1, max=10_000, help="Jobs run at once (default POSTRELAY_WORKER_CONCURRENCY)."
    ),
    tenants: list[UUID] = typer.Option(
        [], "--tenant", help="Serve only these tenants (repeatable)."
    ),
    kinds: list[str] = typer.Option([], "--kind", help="Serve only these kinds (repeatable)."),
    maintenance: bool = typer.Option(
        True, help="Take part in maintenance (stale-claim rescue, retention)."
    ),
    metrics_port: int | None = typer.Option(
        None, min=1, max=65535,
        help="Serve Prometheus metrics on this port at /metrics "
        "(default POSTRELAY_WORKER_METRICS_PORT; unset: off; host POSTRELAY_WORKER_METRICS_HOST).",
    ),
) -> None:
    """Run the jobs of every registered kind until SIGTERM or SIGINT."""
    from postrelay.queue import serve_metrics
    from postrelay.runtime import build_worker, import_apps, run_until_signalled

    overrides = {} if metrics_port is None else {"worker_metrics_port": metrics_port}
    settings = settings_or_exit(**overrides)
    import_apps(apps)
    with database(settings) as db:
        require_migrated(db)
        try:
            process = build_worker(
                settings, db, concurrency=concurrency,
                tenants=tuple(tenants) or None, kinds=tuple(kinds) or None,
                maintenance=maintenance,
            )
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        server = None
        metrics = process.worker.metrics
        if metrics is not None and settings.worker_metrics_port is not None:
            try:
                server = serve_metrics(metrics, settings.worker_metrics_port,
                                       settings.worker_metrics_host)
            except OSError as exc:
                # Named by setting: "metrics on :9464: [Errno -2] ..." left the operator to
                # guess that an empty or mistyped POSTRELAY_WORKER_METRICS_HOST was meant.
                typer.echo(f"error: POSTRELAY_WORKER_METRICS_HOST and --metrics-port: cannot "
                           f"serve metrics on {settings.worker_metrics_host!r} port "
                           f"{settings.worker_metrics_port}: {exc.strerror or exc}", err=True)
                raise typer.Exit(2) from None
        try:
            run(run_until_signalled(process))
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()


@app.command("demo")
def demo_command(
    emit: bool = typer.Option(
        False, "--emit",
        help="Only emit the demo's outbox events, for a relay and worker already running "
        "with --app postrelay.demo.app (docker compose).",
    ),
) -> None:
    """Run the whole system on embedded defaults and print what happened.

    Migrates, starts an SMTP sink, enqueues sample jobs and emits outbox events for three
    tenants, runs a relay and a worker until all has settled, and prints the jobs, the
    email log and where the messages are. Uses the embedded PostgreSQL unless
    POSTRELAY_DATABASE_URL is set."""
    from postrelay.demo import emit_demo_events, run_demo

    settings = settings_or_exit()
    with database(settings) as db:
        if emit:
            emit_demo_events(db, echo=typer.echo)
        else:
            run_demo(settings, db, echo=typer.echo)
