"""The worker process: the registries merged into it keep their claim hooks, and it releases
what its handlers hold open once the worker has stopped."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

from postrelay.core.db import Database, sqlalchemy_url
from postrelay.core.settings import Settings
from postrelay.queue import Job, Registry
from postrelay.runtime import build_worker


def test_merged_registries_keep_every_closer() -> None:
    async def first() -> None: ...

    async def second() -> None: ...

    builtin, app = Registry(), Registry()
    builtin.closers.append(first)
    app.closers.append(second)
    assert builtin.merged(app).closers == [first, second]


def test_merged_registries_keep_every_claim_hook() -> None:
    """A kind's claim hook hears of its jobs through any merge; a handler merged on top
    without one takes its kind's hook away."""
    told: list[str] = []

    async def run(job: Job) -> None: ...

    builtin, app, override = Registry(), Registry(), Registry()
    builtin.register("email_send", run, on_claim=lambda jobs: told.append("email"))
    app.register("reindex", run, on_claim=lambda jobs: told.append("reindex"))
    override.register("reindex", run)
    now = datetime.now(UTC)
    jobs = [Job(uuid4(), uuid4(), kind, {}, 100, 1, 3, now, now, now, None)
            for kind in ("email_send", "reindex")]
    builtin.merged(app).announce(jobs)
    assert told == ["email", "reindex"]
    told.clear()
    builtin.merged(app).merged(override).announce(jobs)
    assert told == ["email"]


async def test_the_built_worker_tells_the_email_handler_of_each_claim(database_url, clean_db):
    """The email handler's read before sending starts when its jobs are claimed: the
    worker's registry, merged from the built-in ones, announces a claim to its hook."""
    db = Database(url=sqlalchemy_url(database_url))
    process = build_worker(Settings(database_url=database_url,
                                    email_from="Acme <noreply@acme.example>"),
                           db, registry=Registry(), maintenance=False)
    (email_sender,) = [close.__self__ for close in process.closers  # type: ignore[attr-defined]
                       if type(close.__self__).__name__ == "EmailSender"]
    now = datetime.now(UTC)
    job = Job(uuid4(), uuid4(), "email_send",
              {"template": "welcome", "to": ["ann@example.com"], "context": {}}, 100, 1, 3,
              now, now, now, None)
    process.worker.registry.announce([job])
    ready = email_sender.claimed_jobs.take(job)
    await email_sender.close()
    assert ready is not None and ready.recipients == ["ann@example.com"]


async def test_stopping_a_worker_process_runs_its_handlers_closers(database_url, clean_db):
    closed: list[str] = []
    app = Registry()

    async def close_app_resource() -> None:
        closed.append("app")

    app.closers.append(close_app_resource)
    db = Database(url=sqlalchemy_url(database_url))
    process = build_worker(Settings(database_url=database_url), db, registry=app,
                           maintenance=False)
    # The built-in handlers' connections (the webhook claim reads, the webhook receivers'
    # kept connections, the email read before sending), the application's resource, the
    # SMTP pool.
    webhook_reads, webhook_clients, email_sender, app_closer, smtp_pool = process.closers
    assert type(webhook_reads.__self__).__name__ == "ClaimedDeliveries"  # type: ignore[attr-defined]
    assert type(webhook_clients.__self__).__name__ == "DeliveryClients"  # type: ignore[attr-defined]
    assert type(email_sender.__self__).__name__ == "EmailSender"  # type: ignore[attr-defined]
    assert app_closer is close_app_resource
    assert type(smtp_pool.__self__).__name__ == "SmtpPool"  # type: ignore[attr-defined]
    await process.start()
    await process.stop()
    assert closed == ["app"]


async def test_smtp_rate_sets_the_email_send_limit_as_a_worker_starts(database_url, engine,
                                                                      clean_db):
    from sqlalchemy import text

    from postrelay.queue import limit_list, limit_set

    with engine.begin() as conn:  # an operator's cap and key stay; the setting owns the rate
        limit_set(conn, actor="ops", kind="email_send", concurrency=5, key="domain")
    db = Database(url=sqlalchemy_url(database_url))
    for _ in range(2):
        process = build_worker(Settings(database_url=database_url, smtp_rate="900/min"), db,
                               registry=Registry(), maintenance=False)
        await process.start()
        await process.stop()
    with engine.connect() as conn:
        (limit,) = limit_list(conn)
        audit = conn.execute(text("SELECT actor FROM mdm.aa_flow_audit ORDER BY id")).all()
    assert (limit.rate_per_sec, limit.burst, limit.concurrency, limit.key) == (15.0, 15, 5,
                                                                              "domain")
    # Set once: the second worker found it as the setting says and wrote nothing.
    assert [a for (a,) in audit] == ["ops", "settings:POSTRELAY_SMTP_RATE"]
