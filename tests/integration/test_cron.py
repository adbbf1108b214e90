"""Cron entries on a real PostgreSQL: create/list/delete rules and exactly-once firing."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from postrelay.core.clock import utcnow
from postrelay.core.errors import ConflictError, NotFoundError, ValidationError
from postrelay.queue.cron import cron_create, cron_delete, cron_list
from postrelay.queue.maintenance import CronScheduler


def cron_jobs(engine) -> list[tuple]:
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT idempotency_key, payload, created_by FROM mdm.aa_job "
            "WHERE created_by LIKE 'cron:%' AND created_by NOT LIKE 'cron:postrelay.%' "
            "ORDER BY created_at")).all()


def test_create_list_delete(engine, tenant):
    with engine.begin() as conn:
        entry = cron_create(conn, "nightly-cleanup", "0 3 * * *", "bulk_import",
                            {"dryRun": False}, tenant_id=tenant)
    assert entry.schedule == "0 0 3 * * *"
    assert entry.last_run is None and entry.next_run is None
    with engine.begin() as conn:
        names = [e.name for e in cron_list(conn, tenant_id=tenant)]
        assert names == ["nightly-cleanup"]
        cron_delete(conn, "nightly-cleanup", actor="ops:alice")
        with pytest.raises(NotFoundError):
            cron_delete(conn, "nightly-cleanup")
        audit = conn.execute(text(
            "SELECT action, actor, detail->>'schedule' FROM mdm.aa_cron_audit "
            "WHERE name = 'nightly-cleanup' ORDER BY id")).all()
    assert [(a, b) for a, b, _ in audit] == [("cron_create", "unknown"),
                                             ("cron_delete", "ops:alice")]
    assert audit[1][2] == "0 0 3 * * *"  # the deleted entry is kept in the audit row


@pytest.mark.parametrize("name", ["night\x00ly", "night\udcffly"])
def test_delete_of_a_name_postgresql_cannot_hold_names_the_field(engine, tenant, name):
    """A NUL reached PostgreSQL as a DataError that aborted the caller's transaction; a
    lone surrogate (a byte that is not UTF-8 on the command line) as UnicodeEncodeError."""
    with engine.begin() as conn:
        with pytest.raises(ValidationError) as info:
            cron_delete(conn, name)
        assert info.value.field == "name"
        assert conn.execute(text("SELECT 1")).scalar() == 1  # the transaction is usable


def test_names_are_unique_per_tenant(engine, tenant):
    from postrelay.queue import ensure_tenant

    with engine.begin() as conn:
        other = ensure_tenant(conn, "other")
        cron_create(conn, "report", "0 * * * *", "reindex", {}, tenant_id=tenant)
        cron_create(conn, "report", "0 * * * *", "reindex", {}, tenant_id=other)
    with engine.begin() as conn, pytest.raises(ConflictError, match="exists for this tenant"):
        cron_create(conn, "report", "0 * * * *", "reindex", {}, tenant_id=other)
    with engine.begin() as conn:
        # By name alone the entry is ambiguous: the tenant must be named.
        with pytest.raises(ValidationError) as info:
            cron_delete(conn, "report")
        assert info.value.field == "tenant_id" and "2 tenants" in info.value.rule
        cron_delete(conn, "report", tenant_id=other)
        assert [e.tenant_id for e in cron_list(conn) if e.name == "report"] == [tenant]
        cron_delete(conn, "report")  # one tenant's only now


async def test_two_tenants_entries_of_one_name_both_fire(engine, async_engine, tenant):
    from postrelay.queue import ensure_tenant

    with engine.begin() as conn:
        other = ensure_tenant(conn, "other")
        for owner in (tenant, other):
            cron_create(conn, "nightly", "* * * * * *", "reindex", {"owner": str(owner)},
                        tenant_id=owner)
    now = utcnow() + timedelta(seconds=2)
    fired = await CronScheduler(async_engine).run_once(now)
    assert [f.name for f in fired].count("nightly") == 2
    with engine.connect() as conn:
        jobs = conn.execute(text(
            "SELECT tenant_id, payload->>'owner', idempotency_key FROM mdm.aa_job "
            "WHERE created_by = 'cron:nightly' ORDER BY tenant_id")).all()
    assert sorted((t, str(t)) for t in (tenant, other)) == [(a, b) for a, b, _ in jobs]
    assert len({key for _, _, key in jobs}) == 2  # the keys name the entry, not the name


def test_the_postrelay_namespace_and_system_kinds_are_the_systems(engine, tenant):
    from postrelay.core.errors import ForbiddenError
    from postrelay.queue.schema import SYSTEM_TENANT_ID

    with engine.begin() as conn:
        for owner in (tenant, SYSTEM_TENANT_ID):
            with pytest.raises(ForbiddenError) as info:
                cron_create(conn, "postrelay.mine", "0 * * * *", "reindex", {},
                            tenant_id=owner)
            assert info.value.code == "name_reserved"
        with pytest.raises(ForbiddenError) as info:
            cron_delete(conn, "postrelay.retention")
        assert info.value.code == "name_reserved"
        with pytest.raises(ForbiddenError) as info:
            cron_create(conn, "sweep", "0 * * * *", "cleanup_jobs", {}, tenant_id=tenant)
        assert info.value.code == "kind_reserved" and "system tenant" in info.value.message
        # The operator may schedule a system kind in the system tenant.
        cron_create(conn, "sweep", "0 * * * *", "cleanup_jobs", {}, tenant_id=SYSTEM_TENANT_ID)
        assert {e.name for e in cron_list(conn)} >= {"postrelay.retention", "sweep"}
        assert [e.name for e in cron_list(conn, tenant_id=tenant)] == []


def test_a_tenant_sees_and_deletes_only_its_own(engine, tenant):
    from postrelay.queue import ensure_tenant

    with engine.begin() as conn:
        other = ensure_tenant(conn, "other")
        cron_create(conn, "theirs", "0 * * * *", "reindex", {}, tenant_id=other)
        assert cron_list(conn, tenant_id=tenant) == []
        with pytest.raises(NotFoundError):
            cron_delete(conn, "theirs", tenant_id=tenant)


@pytest.mark.parametrize(
    ("args", "field"),
    [({"schedule": "@daily"}, "schedule"), ({"kind": "nope"}, "kind"),
     ({"payload": [1]}, "payload"), ({"name": "has space"}, "name"),
     ({"tenant_id": "00000000-0000-0000-0000-00000000beef"}, "tenant_id"),
     ({"max_attempts": 2**31}, "max_attempts")],
)
def test_bad_entries_name_the_field_and_write_nothing(engine, tenant, args, field):
    values = {"name": "x", "schedule": "* * * * *", "kind": "reindex", "payload": {},
              "tenant_id": tenant, **args}
    with engine.begin() as conn:
        with pytest.raises(ValidationError) as info:
            cron_create(conn, values.pop("name"), values.pop("schedule"), values.pop("kind"),
                        values.pop("payload"), **values)
        assert info.value.field == field
        assert cron_list(conn, tenant_id=tenant) == []


@pytest.mark.parametrize(("tenant_id", "rule"), [
    ("nope", "must be a UUID, got 'nope'"), (None, "is required"),
])
def test_a_tenant_that_is_no_uuid_is_refused_in_the_words_of_the_other_commands(
        engine, tenant, tenant_id, rule):
    with engine.begin() as conn:
        with pytest.raises(ValidationError) as info:
            cron_create(conn, "x", "* * * * *", "reindex", {}, tenant_id=tenant_id)
        assert (info.value.field, info.value.rule) == ("tenant_id", rule)


async def test_fires_once_per_slot_with_two_schedulers(engine, async_engine, tenant):
    with engine.begin() as conn:
        cron_create(conn, "every-second", "* * * * * *", "reindex", {"frozen": 1},
                    tenant_id=tenant)
    a, b = CronScheduler(async_engine), CronScheduler(async_engine)
    now = utcnow() + timedelta(seconds=2)
    fired = await asyncio.gather(a.run_once(now), b.run_once(now), a.run_once(now))
    mine = [f for batch in fired for f in batch if f.name == "every-second"]
    assert len(mine) == 1
    jobs = cron_jobs(engine)
    assert len(jobs) == 1 and jobs[0].payload == {"frozen": 1}
    assert jobs[0].created_by == "cron:every-second"
    with engine.connect() as conn:
        (entry,) = cron_list(conn, tenant_id=tenant)
    slot = now.replace(microsecond=0)
    assert entry.last_run == slot and entry.next_run == slot + timedelta(seconds=1)


async def test_missed_slots_fire_once_after_downtime(engine, async_engine, tenant):
    with engine.begin() as conn:
        cron_create(conn, "minutely", "* * * * *", "reindex", {}, tenant_id=tenant)
    scheduler = CronScheduler(async_engine)
    fired = await scheduler.run_once(utcnow() + timedelta(hours=3))
    assert [f.name for f in fired if not f.name.startswith("postrelay.")] == ["minutely"]
    assert len(cron_jobs(engine)) == 1


async def test_deleted_entry_never_fires(engine, async_engine, tenant):
    with engine.begin() as conn:
        cron_create(conn, "doomed", "* * * * * *", "reindex", {}, tenant_id=tenant)
        cron_delete(conn, "doomed")
    fired = await CronScheduler(async_engine).run_once(utcnow() + timedelta(minutes=5))
    assert [f.name for f in fired if not f.name.startswith("postrelay.")] == []
    assert cron_jobs(engine) == []


async def test_retention_is_a_built_in_cron_entry(engine, async_engine, clean_db):
    with engine.connect() as conn:
        (entry,) = [e for e in cron_list(conn) if e.name == "postrelay.retention"]
    assert entry.kind == "cleanup_jobs" and entry.schedule == "0 0 * * * *"


async def test_a_broken_entry_does_not_stop_the_others(engine, async_engine, tenant):
    with engine.begin() as conn:
        cron_create(conn, "fine", "* * * * * *", "reindex", {}, tenant_id=tenant)
        conn.execute(text("INSERT INTO mdm.aa_cron_entry (name, tenant_id, schedule, job_kind, "
                          "payload) VALUES ('broken', :t, '0 0 0 30 2 *', 'reindex', '{}')"),
                     {"t": tenant})
    fired = await CronScheduler(async_engine).run_once(utcnow() + timedelta(seconds=2))
    assert "fine" in [f.name for f in fired]


async def test_a_worker_whose_clock_runs_ahead_fires_nothing_early(
        engine, async_engine, tenant, monkeypatch):
    """Each scheduler read the time off its own host: one whose clock ran a year ahead
    fired the yearly slot at once and moved last_run a year on, so no scheduler on a
    right clock fired it until then. Slots are due by the database's clock, which every
    worker shares (as the claim's available_at is)."""
    with engine.begin() as conn:
        cron_create(conn, "new-year", "0 0 1 1 *", "reindex", {}, tenant_id=tenant)
    ahead = utcnow() + timedelta(days=400)
    monkeypatch.setattr("postrelay.queue.maintenance.scheduler.utcnow", lambda: ahead,
                        raising=False)
    monkeypatch.setattr("postrelay.core.clock.utcnow", lambda: ahead)
    fired = await CronScheduler(async_engine).run_once()
    assert "new-year" not in [f.name for f in fired]
    assert cron_jobs(engine) == []
    with engine.connect() as conn:
        (entry,) = cron_list(conn, tenant_id=tenant)
    assert entry.last_run is None


def _cron_lines(caplog) -> list[tuple[str, dict]]:
    return [(r.event, r.fields) for r in caplog.records
            if getattr(r, "event", "").startswith("postrelay.cron.entry")]


async def test_an_entry_failing_every_round_is_logged_as_it_starts_changes_and_recovers(
        engine, async_engine, tenant, monkeypatch, caplog):
    """An entry whose firing fails fails again every round (its slot stays due): a warning
    a round, every second, in every worker. Now a line when it starts failing, one when the
    reason changes, at most one a minute while it goes on (with how many times it failed),
    and one when it fires again; the entry shows the failure where entries are listed."""
    caplog.set_level(logging.INFO, logger="postrelay")
    with engine.begin() as conn:
        cron_create(conn, "too-big", "* * * * * *", "reindex", {"blob": "x" * 2000},
                    tenant_id=tenant)
    monkeypatch.setenv("POSTRELAY_MAX_PAYLOAD_BYTES", "1024")  # lowered since its creation
    scheduler = CronScheduler(async_engine)
    start = utcnow() + timedelta(seconds=2)

    async def rounds(first: int, last: int) -> None:  # a round a second, as it runs
        for second in range(first, last):
            fired = await scheduler.run_once(start + timedelta(seconds=second))
            assert "too-big" not in [f.name for f in fired]

    await rounds(0, 50)
    [(name, fields)] = _cron_lines(caplog)
    assert name == "postrelay.cron.entry_failing"
    assert fields["name"] == "too-big" and fields["tenant"] == str(tenant)
    assert "over the limit of 1024" in fields["error"]
    with engine.connect() as conn:
        (entry,) = cron_list(conn, tenant_id=tenant)
    assert entry.failing_since == start
    assert "over the limit of 1024" in entry.last_error

    await rounds(50, 70)  # a minute after the first line: one more, with the count
    [_, (name, fields)] = _cron_lines(caplog)
    assert name == "postrelay.cron.entry_still_failing" and fields["name"] == "too-big"
    assert fields["failures"] == 61 and fields["since"] == start.isoformat()
    assert "over the limit of 1024" in fields["error"]

    monkeypatch.setenv("POSTRELAY_MAX_PAYLOAD_BYTES", "1500")  # a new reason: logged at once
    await rounds(70, 72)
    [*_, (name, fields)] = _cron_lines(caplog)
    assert len(_cron_lines(caplog)) == 3
    assert name == "postrelay.cron.entry_failing" and "over the limit of 1500" in fields["error"]
    with engine.connect() as conn:
        (entry,) = cron_list(conn, tenant_id=tenant)
    assert "over the limit of 1500" in entry.last_error

    monkeypatch.delenv("POSTRELAY_MAX_PAYLOAD_BYTES")
    fired = await scheduler.run_once(start + timedelta(seconds=72))
    assert [f.name for f in fired if f.name == "too-big"] == ["too-big"]
    [*_, (name, fields)] = _cron_lines(caplog)
    assert len(_cron_lines(caplog)) == 4
    assert name == "postrelay.cron.entry_recovered" and fields["failures"] == 72
    assert len(cron_jobs(engine)) == 1
    with engine.connect() as conn:
        (entry,) = cron_list(conn, tenant_id=tenant)
    assert entry.failing_since is None and entry.last_error is None


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York"])
async def test_slots_are_utc_whatever_the_sessions_time_zone(database_url, engine, tenant,
                                                             zone):
    """Times are UTC. A server whose `timezone` is the host's (as initdb sets it), or a
    worker with PGTZ set, hands timestamptz values over in that zone, and croniter reads a
    schedule in the zone of the times it is given: `0 2 * * *` fired at 02:00 Berlin time
    (01:00 UTC), and not at all on the day a DST gap skipped 02:00 there."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from postrelay.core.db import sqlalchemy_url

    with engine.begin() as conn:
        entry = cron_create(conn, "two-utc", "0 2 * * *", "reindex", {}, tenant_id=tenant)
        conn.execute(text("UPDATE mdm.aa_cron_entry SET created_at = '2026-03-08 01:30Z' "
                          "WHERE id = :id"), {"id": entry.id})
    zoned = create_async_engine(sqlalchemy_url(database_url),
                                connect_args={"options": f"-c timezone={zone}"})
    try:
        scheduler = CronScheduler(zoned)
        early = await scheduler.run_once(datetime(2026, 3, 8, 1, 59, 59, tzinfo=UTC))
        fired = await scheduler.run_once(datetime(2026, 3, 8, 2, 0, 1, tzinfo=UTC))
    finally:
        await zoned.dispose()
    assert "two-utc" not in [f.name for f in early]
    assert [f.slot for f in fired if f.name == "two-utc"] == [
        datetime(2026, 3, 8, 2, tzinfo=UTC)]
    (key, _, _), = cron_jobs(engine)
    assert key == f"cron:{entry.id}:2026-03-08T02:00:00+00:00"
    with engine.connect() as conn:
        (listed,) = cron_list(conn, tenant_id=tenant)
    assert listed.next_run == datetime(2026, 3, 9, 2, tzinfo=UTC)
