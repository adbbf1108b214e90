"""The composition root: settings → database → engine → handlers → worker and maintenance.

Everything above (CLI, HTTP API, demo) builds processes through here; everything below
receives what it needs as arguments.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from uuid import UUID

from postrelay.core.db import Database
from postrelay.core.errors import ConfigError
from postrelay.core.heap import freeze_startup_heap
from postrelay.core.service import Service
from postrelay.core.settings import Settings
from postrelay.orchestrator import (
    EMAIL_FEEDBACK_TARGET,
    EMAIL_KIND,
    EMAIL_LOG_TARGET,
    EmailHourTally,
    ReturnPath,
    SmtpConfig,
    SmtpPool,
    Templates,
    UnsubscribeLinks,
    check_identity_settings,
    email_feedback_delete_batch,
    email_log_delete_batch,
    email_registry,
    feedback_retention_days,
    suppression_audit_delete_batch,
)
from postrelay.queue import (
    AUDIT_TARGET,
    RETENTION_KIND,
    Cleaner,
    CronScheduler,
    DoneRollup,
    Maintenance,
    Registry,
    Rescuer,
    ThrottlePolicy,
    Worker,
    WorkerConfig,
    WorkerMetrics,
    audit_cleaner,
    backoff_from,
    cleanup_handler,
    default_registry,
    limit_ensure_rate,
    maintenance_interval,
)
from postrelay.relay import (
    EVENT_READERS,
    OUTBOX_TARGET,
    EndpointDirectory,
    Relay,
    RelayConfig,
    RelayWithWebhooks,
    RouteRegistry,
    add_webhook_route,
    default_routes,
    delete_handled_batch,
    webhook_attempt_delete_batch,
    webhook_registry,
)

# The job kinds that read their outbox event when they run, for which retention keeps it:
# webhook deliveries, and a split email route's messages (their context is its payload).
OUTBOX_READERS = (*EVENT_READERS, EMAIL_KIND)


def import_apps(modules: Iterable[str]) -> None:
    """Import the application modules whose `@handler` decorators fill the registry."""
    # Like uvicorn: `--app mymodule` finds modules in the directory the command runs from.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in modules:
        # Checked before importing: a relative or empty name raised TypeError or ValueError
        # from importlib, which an error inside the module could raise as well.
        if not all(part.isidentifier() for part in name.split(".")):
            raise ConfigError(f"--app {name!r}: not a module name; give a dotted module "
                              "path such as myapp.jobs")
        try:
            importlib.import_module(name)
        except (Exception, SystemExit) as exc:  # the application's code, at import
            raise ConfigError(f"--app {name!r}: cannot be imported: {_import_failure(name, exc)}"
                              " (POSTRELAY_LOG_LEVEL=DEBUG logs the traceback)") from exc


def _import_failure(name: str, exc: BaseException) -> str:
    # The module itself or a package on its path, not a module it imports.
    if isinstance(exc, ModuleNotFoundError) and f"{name}.".startswith(f"{exc.name}."):
        return (f"no module named {exc.name!r} in {os.getcwd()} or on the Python path "
                "(run from the folder that holds it, or install it)")
    if isinstance(exc, SystemExit):  # argument parsing at import time, say
        return f"it called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {exc}"


SMTP_RATE_ACTOR = "settings:POSTRELAY_SMTP_RATE"


@dataclass
class WorkerProcess:
    worker: Worker
    maintenance: Maintenance | None
    scheduler: CronScheduler | None
    # Released after the worker has stopped (the handlers' connections, the SMTP pool's).
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    # Applied before the worker claims: POSTRELAY_SMTP_RATE as the email_send limit's rate.
    smtp_rate: str | None = None

    async def start(self) -> None:
        if self.smtp_rate is not None:
            rate = self.smtp_rate
            async with self.worker.engine.begin() as conn:
                await conn.run_sync(lambda sync: limit_ensure_rate(
                    sync, actor=SMTP_RATE_ACTOR, kind="email_send", rate=rate))
        await self.worker.start()
        for service in (self.maintenance, self.scheduler):
            if service is not None:
                await service.start()

    async def stop(self) -> None:
        # First of all stop claiming: the services below may take a round trip each.
        self.worker.stop_claiming()
        for service in (self.scheduler, self.maintenance):
            if service is not None:
                await service.stop()
        await self.worker.stop()
        for close in self.closers:
            await close()
        await self.worker.engine.dispose()


def build_worker(
    settings: Settings,
    db: Database,
    *,
    registry: Registry | None = None,
    concurrency: int | None = None,
    tenants: tuple[UUID, ...] | None = None,
    kinds: tuple[str, ...] | None = None,
    maintenance: bool = True,
) -> WorkerProcess:
    concurrency = concurrency or settings.worker_concurrency
    # pool_pre_ping would add a round trip to every claim; a dropped connection is noticed
    # by the failing statement instead, which invalidates the whole pool for a reconnect.
    # Custom plans: a generic plan of job_finalize_many, estimated from one running row,
    # degrades into a nested loop whose cost grows with the square of the batch.
    engine = db.async_engine(pool_pre_ping=False, pool_size=max(5, min(concurrency, 20)),
                             max_overflow=10,
                             connect_args={"options": "-c plan_cache_mode=force_custom_plan"})
    # Built-in handlers first (retention, webhooks, email); the application's on top.
    throttle = ThrottlePolicy(step_secs=settings.throttle_step_secs)
    builtin = webhook_registry(engine, allow_private=settings.webhook_allow_private,
                               throttle=throttle)
    check_identity_settings(settings)
    # The pool connects on the first message, so a worker that sends none opens nothing.
    smtp = SmtpPool(SmtpConfig.from_settings(settings))
    builtin = builtin.merged(email_registry(
        engine, Templates(settings.email_templates_dir), smtp,
        default_from=settings.email_from, message_id_domain=settings.email_message_id_domain,
        return_path=ReturnPath.from_settings(settings),
        unsubscribe=UnsubscribeLinks.from_settings(settings), throttle=throttle,
        concurrency=concurrency))
    outbox = Cleaner(partial(delete_handled_batch, readers=OUTBOX_READERS),
                     settings.outbox_retention_days)
    attempts = Cleaner(webhook_attempt_delete_batch, settings.webhook_attempt_retention_days)
    # Every window from the settings: the handler takes none from a job's payload.
    email_log = Cleaner(email_log_delete_batch, settings.email_log_retention_days)
    feedback = Cleaner(email_feedback_delete_batch, feedback_retention_days(settings))
    builtin.register(RETENTION_KIND, cleanup_handler(
        engine, settings.job_retention_days,
        {OUTBOX_TARGET: outbox, "webhook_attempts": attempts, EMAIL_LOG_TARGET: email_log,
         EMAIL_FEEDBACK_TARGET: feedback,
         AUDIT_TARGET: audit_cleaner(settings.audit_retention_days,
                                     [suppression_audit_delete_batch(settings)])}))
    handlers = builtin.merged(registry if registry is not None else default_registry)
    config = WorkerConfig(
        concurrency=concurrency,
        tenants=tenants,
        kinds=kinds,
        poll_interval_secs=settings.worker_poll_interval_secs,
        lease_secs=settings.job_lease_secs,
        grace_secs=settings.worker_grace_secs,
        default_timeout_secs=settings.job_timeout_secs,
        listen=settings.listens,
        claim_ahead_secs=settings.worker_claim_ahead_secs,
        fair=settings.fair_claiming,
        tenant_weights=dict(settings.tenant_weights),
    )
    backoff = backoff_from(
        settings.job_backoff, settings.job_retry_delay_secs, settings.job_backoff_max_secs
    )
    # Metrics only when something will serve them (POSTRELAY_WORKER_METRICS_PORT).
    metrics = WorkerMetrics() if settings.worker_metrics_port is not None else None
    worker = Worker(engine, config, registry=handlers, backoff=backoff, listen_url=db.libpq_url,
                    metrics=metrics)
    if not maintenance:
        return WorkerProcess(worker, None, None, [*handlers.closers, smtp.close],
                             smtp_rate=settings.smtp_rate)
    keeper = Maintenance(
        engine,
        holder=worker.id,
        interval_secs=maintenance_interval(settings.maintenance_interval_secs,
                                           settings.job_lease_secs),
        rescuer=Rescuer(engine, lease_secs=settings.job_lease_secs, actor=worker.id),
        rollups=(DoneRollup(engine), EmailHourTally(engine)),
    )
    scheduler = CronScheduler(engine, interval_secs=settings.cron_interval_secs)
    return WorkerProcess(worker, keeper, scheduler, [*handlers.closers, smtp.close],
                         smtp_rate=settings.smtp_rate)


def build_relay(
    settings: Settings, db: Database, *, routes: RouteRegistry | None = None
) -> RelayWithWebhooks:
    """The relay with the application's routes plus the built-in webhook route."""
    # One connection per batch in flight, and one for the webhook directory.
    engine = db.async_engine(pool_pre_ping=False, pool_size=settings.relay_concurrency + 1,
                             max_overflow=2,
                             connect_args={"options": "-c plan_cache_mode=force_custom_plan"})
    config = RelayConfig(batch_size=settings.relay_batch_size,
                         max_attempts=settings.relay_max_attempts, listen=settings.listens,
                         concurrency=settings.relay_concurrency,
                         max_jobs_per_event=settings.relay_max_jobs_per_event,
                         max_bytes_per_event=settings.relay_max_bytes_per_event)
    directory = EndpointDirectory(engine, listen_url=db.libpq_url if settings.listens else None)
    webhooks = RouteRegistry()
    add_webhook_route(webhooks, directory)
    all_routes = (routes if routes is not None else default_routes).merged(webhooks)
    relay = Relay(engine, all_routes, config, listen_url=db.libpq_url)
    return RelayWithWebhooks(relay, directory)


async def run_until_signalled(process: Service) -> None:
    """Run a process's service until SIGTERM or SIGINT, then stop gracefully. What was
    built before it starts is left out of later garbage collections (core/heap.py); that is
    done first, so that the collection it makes holds up no claim."""
    freeze_startup_heap()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await process.start()
    try:
        await stop.wait()
    finally:
        await process.stop()
