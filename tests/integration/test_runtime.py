"""The worker process releases what its handlers hold open once the worker has stopped."""

from __future__ import annotations

from postrelay.core.db import Database, sqlalchemy_url
from postrelay.core.settings import Settings
from postrelay.queue import Registry
from postrelay.runtime import build_worker


def test_merged_registries_keep_every_closer() -> None:
    async def first() -> None: ...

    async def second() -> None: ...

    builtin, app = Registry(), Registry()
    builtin.closers.append(first)
    app.closers.append(second)
    assert builtin.merged(app).closers == [first, second]


async def test_stopping_a_worker_process_runs_its_handlers_closers(database_url, clean_db):
    closed: list[str] = []
    app = Registry()

    async def close_app_resource() -> None:
        closed.append("app")

    app.closers.append(close_app_resource)
    db = Database(url=sqlalchemy_url(database_url))
    process = build_worker(Settings(database_url=database_url), db, registry=app,
                           maintenance=False)
    # The built-in email handler's connection, the application's resource, the SMTP pool.
    email_sender, app_closer, smtp_pool = process.closers
    assert type(email_sender.__self__).__name__ == "EmailSender"  # type: ignore[attr-defined]
    assert app_closer is close_app_resource
    assert type(smtp_pool.__self__).__name__ == "SmtpPool"  # type: ignore[attr-defined]
    await process.start()
    await process.stop()
    assert closed == ["app"]
