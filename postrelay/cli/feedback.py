"""`postrelay feedback ingest|list` and `postrelay inbound`: delivery feedback (bounces,
complaints, delivery reports) read from files or received by SMTP, and the operator's view."""

from __future__ import annotations

import os
import signal
import ssl
import sys
import threading
from typing import Any

import typer
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from postrelay.cli.boundary import GuardedGroup, fail
from postrelay.cli.common import (
    cannot_listen,
    check_listen,
    database,
    require_migrated,
    settings_or_exit,
    transaction,
    user_errors,
)
from postrelay.cli.copies import run_copies
from postrelay.cli.emails import parse_time
from postrelay.cli.output import cell, print_json, table
from postrelay.cli.root import app
from postrelay.core.errors import ConfigError
from postrelay.core.heap import freeze_startup_heap
from postrelay.core.settings import Settings, load_settings
from postrelay.core.telemetry import configure_logging
from postrelay.orchestrator import (
    InboundConfig,
    InboundServer,
    Recorded,
    ReturnPath,
    SuppressionPolicy,
    UnsubscribeLinks,
    feedback_list,
    inbox_backlog,
    ingest,
    mark_seen,
    messages,
)

_LISTEN_NAMES = ("--host (POSTRELAY_INBOUND_HOST)", "--port (POSTRELAY_INBOUND_PORT)")
EX_TEMPFAIL = 75  # sysexits.h: a temporary failure, the caller should try again later
feedback_app = typer.Typer(help="Delivery feedback: bounces, complaints, delivery reports.",
                           no_args_is_help=True,
                           cls=GuardedGroup)
app.add_typer(feedback_app, name="feedback")


@feedback_app.command("ingest")
def feedback_ingest(
    files: list[str] = typer.Argument(..., help="Messages, mbox files, Maildir folders; - "
                                                "for stdin."),
    to: list[str] = typer.Option([], "--to", help="The envelope recipient (a pipe "
                                                  "transport's ${recipient}); repeatable."),
    seen: bool = typer.Option(False, "--mark-seen", help="In a Maildir, read only the "
                              "messages not flagged seen, and flag each seen once it is "
                              "recorded."),
) -> None:
    """Record feedback from messages, mbox files or Maildir folders.

    Exits 75 (EX_TEMPFAIL) when the database fails or a setting is bad, so that a mail
    delivery agent keeps the message and tries again."""
    with user_errors():
        try:
            settings = load_settings()
            configure_logging(settings.log_level)
            with database(settings) as db:
                return_path, policy = _feedback_settings(settings, need_domain=False)
                links = UnsubscribeLinks.from_settings(settings)
                engine = db.sync_engine()
                for mail in messages(files, unseen_only=seen,
                                     max_bytes=settings.inbound_max_bytes):
                    done = ingest(engine, mail.raw, envelope_to=to, return_path=return_path,
                                  policy=policy, max_bytes=settings.inbound_max_bytes,
                                  unsubscribe=links, cut=mail.cut)
                    for recorded in done:
                        typer.echo(f"{mail.name}: {_summary(recorded)}")
                    if not done:
                        typer.echo(f"{mail.name}: empty, no message to record")
                    if mail.maildir_file is not None:  # committed: the next run skips it
                        mark_seen(mail.maildir_file)
        except (SQLAlchemyError, ConfigError) as exc:
            # A pipe transport (Postfix's, Exim's) or procmail retries on EX_TEMPFAIL alone
            # and returns the message on any other failure: a bounce returned is dropped,
            # also while a setting is being put right. What was recorded before stays, and
            # recording it again changes nothing.
            fail(exc, EX_TEMPFAIL)


@feedback_app.command("list")
def feedback_list_command(
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant id."),
    kind: str | None = typer.Option(None, "--kind", help="delivered/delayed/soft-bounced/"
                                    "bounced/complaint/unsubscribe/auto-reply/unparsed"),
    source: str | None = typer.Option(None, "--source", help="mail/ses/postmark/sendgrid/"
                                      "one-click"),
    unmatched: bool = typer.Option(False, "--unmatched", help="Only what matched no message."),
    since: str | None = typer.Option(None, "--since", help="30m, 2h, 7d or an ISO time."),
    limit: int = typer.Option(100, "--limit", help="At most this many (1-1000)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Feedback received, newest first."""
    with transaction() as conn:
        rows = feedback_list(conn, tenant_id=tenant, kind=kind, source=source,
                             since=parse_time(since, "since"), unmatched=unmatched,
                             limit=limit)
    if as_json:
        print_json(rows)
        return
    typer.echo(table(
        ["ID", "RECEIVED", "KIND", "RECIPIENT", "STATUS", "SOURCE", "LOG ROW", "SUPPRESSED",
         "DIAGNOSTIC"],
        [[r["id"], r["received_at"], r["kind"], r["recipient"] or "-", r["status"] or "-",
          r["source"], _log_row(r), "yes" if r["suppressed"] else "no",
          cell(r["diagnostic"] or (r["detail"] or {}).get("reason"))] for r in rows],
    ) if rows else "no feedback")


@app.command("inbound")
def inbound(
    host: str | None = typer.Option(None, "--host", help="Default POSTRELAY_INBOUND_HOST; "
                                    "empty: every address, IPv4 and IPv6."),
    port: int | None = typer.Option(None, "--port", min=1, max=65535,
                                    help="Default POSTRELAY_INBOUND_PORT."),
    processes: int = typer.Option(1, "--processes", min=1, max=256,
                                  help="Receivers on the port, each a process of its own."),
    reuse_port: bool = typer.Option(False, "--reuse-port", help="Share the port with other "
                                    "postrelay inbound processes started with it "
                                    "(SO_REUSEPORT); --processes sets it for its own."),
) -> None:
    """SMTP receiver for the bounce domain's feedback mail."""
    settings = settings_or_exit()
    if processes > 1:
        with user_errors():  # a setting's error once, rather than from every process
            _feedback_settings(settings, need_domain=True)
            _tls(settings)
            UnsubscribeLinks.from_settings(settings)
            check_listen(settings.inbound_host if host is None else host,
                         settings.inbound_port if port is None else port, *_LISTEN_NAMES,
                         reuse_port=True)
            with database(settings) as db:  # unreachable or not migrated: said once too
                require_migrated(db)
        raise typer.Exit(_receivers(host, port, processes))
    with user_errors(), database(settings) as db:
        return_path, policy = _feedback_settings(settings, need_domain=True)
        assert return_path is not None
        config = InboundConfig(host=settings.inbound_host if host is None else host,
                               port=settings.inbound_port if port is None else port,
                               max_bytes=settings.inbound_max_bytes,
                               max_connections=settings.inbound_max_connections,
                               tls=_tls(settings),
                               unsubscribe=UnsubscribeLinks.from_settings(settings),
                               reuse_port=reuse_port)
        check_listen(config.host, config.port, *_LISTEN_NAMES, reuse_port=reuse_port)
        # Refused, as the worker and the relay are, when the database cannot be reached or
        # is not migrated: a receiver listening anyway would answer every message 451,
        # with only its log to say why. Once it runs, an outage is ridden out (451: the
        # sending MTAs keep the mail and retry).
        require_migrated(db)
        with db.sync_engine(poolclass=NullPool).connect() as conn:  # closed once read
            waiting = inbox_backlog(conn)["waiting"]
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        # No pre-ping: it would cost a round trip per transaction, and the receiver retries
        # a batch that met a lost connection on new ones anyway. Generic plans: the
        # receiver's statements take their batch as one jsonb document, which a plan made
        # for one batch fits as well as any other, so the planner need not run every time.
        # The commits that must wait for their WAL flush (the inbox write each 250 promises,
        # and the processor's, which keeps its WAL out of the next inbox commit) ask for it
        # in their own statements (sql/feedback.sql), so it holds behind a pooler too.
        engine = db.async_engine(pool_pre_ping=False, connect_args={
            "options": "-c plan_cache_mode=force_generic_plan"})
        server = InboundServer(engine, return_path, policy, config)
        # core/heap.py: no full collection walks start-up again. Before the server listens,
        # so that the collection made first delays no session.
        freeze_startup_heap()
        try:
            with server:
                typer.echo(f"inbound: mail for {return_path.domain} on {config.host or '*'}:"
                           f"{config.port}" + (" (STARTTLS)" if config.tls else "")
                           + (f", shared by process {os.getpid()}" if reuse_port else "")
                           + (f"; {waiting} accepted before, waiting to be recorded"
                              if waiting else ""))
                stop.wait()
        except OSError as exc:  # an address that names no host, a port taken
            if exc.errno is None:  # not the socket's: aiosmtpd's start-up timeout
                raise
            raise cannot_listen(exc, config.host, config.port, *_LISTEN_NAMES) from None


def _receivers(host: str | None, port: int | None, processes: int) -> int:
    """`processes` receivers on one port, until SIGTERM or SIGINT, or until one ends."""
    argv = [sys.executable, "-m", "postrelay", "inbound", "--reuse-port"]
    argv += ["--host", host] if host is not None else []
    argv += ["--port", str(port)] if port is not None else []
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return run_copies("inbound", argv, processes, stop)


def _feedback_settings(settings: Settings, *, need_domain: bool
                       ) -> tuple[ReturnPath | None, SuppressionPolicy]:
    return_path = ReturnPath.from_settings(settings)
    if need_domain and return_path is None:
        raise ConfigError("POSTRELAY_EMAIL_BOUNCE_DOMAIN: required by `postrelay inbound` "
                          "(the domain whose mail it accepts)")
    return return_path, SuppressionPolicy.from_settings(settings)


def _tls(settings: Settings) -> ssl.SSLContext | None:
    cert, key = settings.inbound_tls_cert, settings.inbound_tls_key
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigError("POSTRELAY_INBOUND_TLS_CERT and POSTRELAY_INBOUND_TLS_KEY: set both "
                          "or neither")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:  # missing, unreadable, or not a matching pair
        raise ConfigError(f"POSTRELAY_INBOUND_TLS_CERT and POSTRELAY_INBOUND_TLS_KEY: cannot "
                          f"load {cert} and {key}: {exc}") from None
    return context


def _log_row(row: dict[str, Any]) -> str:
    """The LOG ROW column: the row the report is about; a signed link's unsubscribe, which
    names no message; or none."""
    if row["email_log_id"]:
        return str(row["email_log_id"])
    return "signed link" if row["matched_by"] == "token" else "unmatched"


def _summary(recorded: Recorded) -> str:
    if recorded.duplicate:
        return "already recorded"
    parts: list[Any] = [f"feedback {recorded.feedback_id}",
                        f"matched by {recorded.matched_by}" if recorded.matched_by
                        else "unmatched"]
    if recorded.suppressed:
        parts.append("suppressed")
    if recorded.completed_job:
        parts.append(f"completed held job {recorded.completed_job}")
    if recorded.event_type:
        parts.append(recorded.event_type)
    return ", ".join(parts)
