"""`postrelay demo`: the whole system on embedded defaults, in one command.

Migrates the database (the embedded PostgreSQL unless POSTRELAY_DATABASE_URL is set) and
starts an embedded SMTP sink that keeps what it receives in a Maildir. Then it enqueues
background jobs (some fail and retry, one ends in the DLQ) and emits outbox events for
three tenants (see `emails`), runs a relay and a worker with a progress bar until
everything has settled, lets a few accepted messages bounce later and one draw a complaint
(see `feedback`: through a real inbound listener, to the messages' VERP addresses), and
prints the jobs, the email log by outcome, the feedback and where the received messages
can be read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from pydantic import SecretStr
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from sqlalchemy import Engine

from postrelay.core.db import Database
from postrelay.core.migrate import upgrade
from postrelay.core.settings import Settings
from postrelay.core.sqlfiles import load_queries
from postrelay.demo import feedback
from postrelay.demo.emails import SENDER, TEMPLATES, TENANTS, demo_routes, sample_events
from postrelay.demo.jobs import demo_registry, sample_jobs
from postrelay.demo.sink import demo_sink_handler
from postrelay.orchestrator import SuppressionPolicy
from postrelay.queue import enqueue_many, ensure_tenant
from postrelay.relay import emit_many
from postrelay.runtime import build_relay, build_worker
from postrelay.testing import SmtpSink

DEMO_SQL = load_queries("postrelay.demo", "sql/demo.sql")
Echo = Callable[[str], object]  # where the demo prints its progress (print, typer.echo)
SETTLED_POLL_SECS = 0.1


@dataclass
class DemoReport:
    jobs: dict[str, Counter[str]] = field(default_factory=dict)  # kind -> status -> n
    emails: list[dict[str, Any]] = field(default_factory=list)
    dead: list[dict[str, Any]] = field(default_factory=list)
    feedback: list[dict[str, Any]] = field(default_factory=list)
    received: int = 0
    maildir: Path | None = None

    @property
    def by_status(self) -> Counter[str]:
        return sum(self.jobs.values(), Counter())

    @property
    def email_outcomes(self) -> Counter[str]:
        return Counter(row["status"] for row in self.emails)


def run_demo(settings: Settings, db: Database, echo: Echo = print) -> DemoReport:
    started = time.perf_counter()
    since = datetime.now(UTC)
    upgrade(db.url)
    engine = db.sync_engine()
    maildir = settings.embedded_data_dir.parent / "demo-mail"
    with SmtpSink(handler=demo_sink_handler(maildir)) as sink:
        with engine.begin() as conn:
            tenants = {name: ensure_tenant(conn, name) for name in TENANTS}
            jobs = enqueue_many(conn, sample_jobs(tenants["acme"]), created_by="postrelay.demo")
            events = emit_many(conn, [e for name, tenant_id in tenants.items()
                                      for e in sample_events(tenant_id, name)],
                               created_by="postrelay.demo")
        echo(f"database: {_where(settings, db)}")
        echo(f"SMTP sink: {sink.host}:{sink.port}, keeping messages in {maildir}")
        echo(f"enqueued {len(jobs)} jobs and emitted {len(events)} outbox events for "
             f"{', '.join(TENANTS)}; running a relay and a worker until they settle…")
        # Short retry delay so the demo finishes in seconds; production uses the settings.
        # A bounce domain: every message's envelope sender is a VERP address naming it.
        demo_settings = settings.model_copy(update={
            "job_retry_delay_secs": 0.2, "smtp_host": sink.host, "smtp_port": sink.port,
            "smtp_security": "none", "smtp_username": None, "email_from": SENDER,
            "email_templates_dir": TEMPLATES, "email_bounce_domain": feedback.BOUNCE_DOMAIN,
            "feedback_secret": SecretStr(feedback.SECRET),
        })
        logging.getLogger("postrelay").setLevel(logging.ERROR)  # the report says it all
        ids = list(tenants.values())
        asyncio.run(_run_until_settled(demo_settings, db, engine, ids, since))
        dsns, complaints = feedback.send_late_feedback(
            db.async_engine(pool_pre_ping=False), sink.handler.received,
            SuppressionPolicy.from_settings(demo_settings))
        echo(f"{feedback.describe_late(dsns, complaints)}, through an inbound listener")
        report = _report(engine, ids, since, received=len(sink.handler.received), maildir=maildir)
    engine.dispose()
    _print(report, echo, time.perf_counter() - started)
    return report


def emit_demo_events(db: Database, echo: Echo = print) -> int:
    """Emit the demo's outbox events and return: a relay and worker already running with
    `--app postrelay.demo.app` (docker compose) send them to the configured SMTP server."""
    upgrade(db.url)
    engine = db.sync_engine()
    try:
        with engine.begin() as conn:
            tenants = {name: ensure_tenant(conn, name) for name in TENANTS}
            events = emit_many(conn, [e for name, tenant_id in tenants.items()
                                      for e in sample_events(tenant_id, name)],
                               created_by="postrelay.demo")
    finally:
        engine.dispose()
    echo(f"emitted {len(events)} outbox events for {', '.join(TENANTS)}; a relay and a "
         "worker running with --app postrelay.demo.app send them (see `postrelay emails`)")
    return len(events)


async def _run_until_settled(
    settings: Settings, db: Database, engine: Engine, tenants: list[UUID], since: datetime
) -> None:
    relay = build_relay(settings, db, routes=demo_routes())
    worker = build_worker(settings, db, registry=demo_registry(), concurrency=8,
                          tenants=tuple(tenants), maintenance=False)
    await relay.start()
    await worker.start()
    params = {"tenants": [str(t) for t in tenants], "since": since}
    columns = (TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn())
    try:
        with Progress(*columns, transient=False) as progress:
            relayed = progress.add_task("events relayed", total=None)
            settled = progress.add_task("jobs settled", total=None)
            while True:
                with engine.connect() as conn:
                    p = conn.execute(DEMO_SQL["demo_progress"], params).one()
                progress.update(relayed, completed=p.events_settled, total=p.events)
                progress.update(settled, completed=p.jobs_settled, total=p.jobs)
                if p.events_settled == p.events and p.jobs_settled == p.jobs:
                    return
                await asyncio.sleep(SETTLED_POLL_SECS)
    finally:
        await relay.stop()
        await worker.stop()


def _report(engine: Engine, tenants: list[UUID], since: datetime, *, received: int,
            maildir: Path) -> DemoReport:
    params = {"tenants": [str(t) for t in tenants], "since": since}
    report = DemoReport(received=received, maildir=maildir)
    with engine.connect() as conn:
        for row in conn.execute(DEMO_SQL["demo_job_counts"], params):
            report.jobs.setdefault(row.kind, Counter())[row.status] = row.n
        report.emails = [dict(r) for r in
                         conn.execute(DEMO_SQL["demo_email_rows"], params).mappings()]
        report.dead = [dict(r) for r in
                       conn.execute(DEMO_SQL["demo_dead_jobs"], params).mappings()]
        report.feedback = [dict(r) for r in
                           conn.execute(DEMO_SQL["demo_feedback_rows"], params).mappings()]
    return report


def _print(report: DemoReport, echo: Echo, elapsed: float) -> None:
    echo(f"\nsettled in {elapsed:.1f} s")
    statuses = ("pending", "running", "done", "failed", "dlq")
    echo("jobs by status: " + ", ".join(f"{s}={report.by_status[s]}" for s in statuses))
    for kind, counts in sorted(report.jobs.items()):
        echo(f"  {kind:<12} " + ", ".join(f"{s}={n}" for s, n in sorted(counts.items())))
    echo("\nemail log by outcome: " + ", ".join(
        f"{s}={n}" for s, n in sorted(report.email_outcomes.items())))
    for row in report.emails:
        if row["status"] == "sent":
            continue
        if row["status"] == "partial":  # the refused recipients' replies, not the 250
            refused = {a: r for a, r in (row["recipient_results"] or {}).items()
                       if r["status"] == "refused"}
            why = "; ".join(f"{a} refused with {r['code']} {r['enhanced'] or ''} {r['text']}"
                            for a, r in refused.items()) + " (delivered to the others)"
        else:
            reply = " ".join(str(v) for v in (row["smtp_code"], row["smtp_enhanced"],
                                               row["smtp_response"]) if v)
            why = reply or (row["error"] or "").splitlines()[-1]
        to = "" if row["status"] == "partial" else ", ".join(row["to_addresses"]) + ": "
        echo(f"  {row['status']:<10} {row['tenant']:<8} {row['template']:<14} {to}{why}")
    echo(f"\nfeedback after the SMTP handoff ({len(report.feedback)}):")
    for row in report.feedback:
        then = f"{row['status']} → {row['delivery']}" if row["delivery"] else row["status"]
        words = [f"{row['kind']} ({row['source']})", row["code"], row["diagnostic"]]
        said = " ".join(w for w in words if w)
        effect = "; address suppressed" if row["suppressed"] else ""
        echo(f"  {then:<18} {row['tenant']:<8} {row['template']:<14} {row['recipient']}: "
             f"{said}{effect}")
    echo(f"\ndead-letter queue ({len(report.dead)}):")
    for job in report.dead:
        last_line = (job["last_error"] or "").strip().splitlines()[-1:]
        echo(f"  {job['id']} {job['kind']} attempts={job['attempts']}/{job['max_attempts']}")
        echo(f"    last error: {last_line[0] if last_line else '-'}")
    echo(f"\nthe SMTP sink received {report.received} messages; read them in the Maildir "
         f"{report.maildir} (one file per message under new/, or `mutt -f {report.maildir}`)")
    echo("next: `postrelay emails`, `postrelay emails show ID`, `postrelay feedback list`, "
         "`postrelay emails suppressed`, `postrelay dlq list`, `postrelay outbox status`")


def _where(settings: Settings, db: Database) -> str:
    if db.embedded is not None:
        return f"embedded PostgreSQL in {settings.embedded_data_dir}"
    return db.url.render_as_string(hide_password=True)
