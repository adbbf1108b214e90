"""A broken cron entry with several schedulers on a real PostgreSQL. Every worker runs the
scheduler, and a failed firing rolls its claim of the slot back, so every worker fires the
slot again each round and fails. The lines about it are the entry's, not each worker's: one
when it starts failing, one a minute while it goes on, one when it recovers."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from sqlalchemy.ext.asyncio import create_async_engine

from postrelay.core.clock import utcnow
from postrelay.core.db import sqlalchemy_url
from postrelay.queue.cron import cron_create, cron_list
from postrelay.queue.maintenance import CronScheduler
from tests.factories import scalar


def _lines(caplog, name: str) -> list[dict]:
    return [r.fields for r in caplog.records if getattr(r, "event", "") == name]


async def test_a_broken_entry_is_logged_once_whatever_the_number_of_schedulers(
        engine, database_url, tenant, monkeypatch, caplog):
    """Two schedulers, each on its own engine (as two workers are), both running every
    round: the entry's failure was logged by each of them, start, every minute and
    recovery alike."""
    caplog.set_level(logging.INFO, logger="postrelay")
    with engine.begin() as conn:
        cron_create(conn, "too-big", "* * * * * *", "reindex", {"blob": "x" * 2000},
                    tenant_id=tenant)
    monkeypatch.setenv("POSTRELAY_MAX_PAYLOAD_BYTES", "1024")  # lowered since its creation
    engines = [create_async_engine(sqlalchemy_url(database_url)) for _ in range(2)]
    schedulers = [CronScheduler(e) for e in engines]
    start = utcnow() + timedelta(seconds=2)

    async def rounds(first: int, last: int, *, fires: bool = False) -> None:
        for second in range(first, last):  # a round a second in each, together
            at = start + timedelta(seconds=second)
            fired = await asyncio.gather(*(s.run_once(at) for s in schedulers))
            mine = [f.name for batch in fired for f in batch if f.name == "too-big"]
            assert mine == (["too-big"] if fires else [])

    try:
        await rounds(0, 125)
        (first,) = _lines(caplog, "postrelay.cron.entry_failing")
        assert first["name"] == "too-big" and "over the limit of 1024" in first["error"]
        # A minute and two minutes after the first line.
        still = _lines(caplog, "postrelay.cron.entry_still_failing")
        assert len(still) == 2, still
        assert {line["since"] for line in still} == {start.isoformat()}
        with engine.connect() as conn:
            (entry,) = cron_list(conn, tenant_id=tenant)
        assert entry.failing_since == start and "over the limit of 1024" in entry.last_error

        monkeypatch.delenv("POSTRELAY_MAX_PAYLOAD_BYTES")
        await rounds(125, 126, fires=True)
        (recovered,) = _lines(caplog, "postrelay.cron.entry_recovered")
        assert recovered["name"] == "too-big" and recovered["since"] == start.isoformat()
        await rounds(126, 130, fires=True)  # fired each second now: nothing more to say
        assert len(_lines(caplog, "postrelay.cron.entry_recovered")) == 1
        assert len(_lines(caplog, "postrelay.cron.entry_failing")) == 1
        assert scalar(engine, "SELECT count(*) FROM mdm.aa_job "
                              "WHERE created_by = 'cron:too-big'") == 5
    finally:
        for e in engines:
            await e.dispose()
