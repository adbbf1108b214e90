"""The email hour tally (orchestrator/email_hours.py): the bounce and complaint rates are
the email log's, whether an hour's answered messages come from the tally or are counted
live, whatever the rounds and however many leaders run them; late bounces count."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.db import Database, sqlalchemy_url
from postrelay.core.settings import Settings
from postrelay.orchestrator import EmailHourTally, feedback_rates
from postrelay.orchestrator.email_hours import (
    CATCH_UP,
    KEEP,
    MARGIN,
    MAX_HOURS_PER_ROUND,
    TallyResult,
)
from postrelay.queue import DoneRollup, Maintenance, Rescuer
from postrelay.runtime import build_worker
from tests.integration.worker_helpers import wait_until, waiting_on_a_lock

HOUR = timedelta(hours=1)
ANSWERED = ("sent", "partial", "bounced")


def db_now(engine: Engine) -> datetime:
    with engine.connect() as conn:
        return conn.execute(text("SELECT now()")).scalar_one()


def whole_hour(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def add_log(engine: Engine, tenant_id: uuid.UUID, *created: datetime, status: str = "sent",
            delivery: str | None = None) -> None:
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO mdm.aa_email_log (tenant_id, template, from_address, recipients, "
            "to_addresses, message_id, status, attempt, created_at, delivery) VALUES (:t, "
            "'welcome', 'noreply@acme.example', '{ann@example.com}', '{ann@example.com}', "
            "'<m@acme.example>', :status, 1, :at, :delivery)"),
            [{"t": tenant_id, "status": status, "at": at, "delivery": delivery}
             for at in created])


def truth(engine: Engine, now: datetime) -> dict[uuid.UUID, tuple[int, ...]]:
    """Each tenant's (messages, bounced, complained) over 24 hours, then 7 days, counted
    from the log rows themselves, each window from the whole UTC hour it starts in."""
    day, week = whole_hour(now - timedelta(hours=24)), whole_hour(now - timedelta(days=7))
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT tenant_id, created_at, status, delivery FROM mdm.aa_email_log")).all()
    counts: dict[uuid.UUID, list[int]] = {}
    for tenant_id, created_at, status, delivery in rows:
        if status not in ANSWERED or not week <= created_at <= now:
            continue
        seen = counts.setdefault(tenant_id, [0] * 6)
        bounced = status == "bounced" or delivery == "bounced"
        for offset, start in ((0, day), (3, week)):
            if created_at >= start:
                seen[offset] += 1
                seen[offset + 1] += bounced
                seen[offset + 2] += delivery == "complained"
    return {tenant_id: tuple(c) for tenant_id, c in counts.items()}


def rates(engine: Engine, now: datetime, scope: uuid.UUID | None = None
          ) -> dict[uuid.UUID, tuple[int, ...]]:
    with engine.connect() as conn:
        found = feedback_rates(conn, tenant_id=scope, now=now)
    return {row["tenant_id"]: tuple(row[f"{name}_{window}"] for window in ("24h", "7d")
                                    for name in ("messages", "bounced", "complained"))
            for row in found}


def tally(engine: Engine) -> dict[tuple[datetime, uuid.UUID, str], int]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT hour, tenant_id, status, messages FROM mdm.aa_email_hour")).all()
    return {(hour, tenant_id, status): n for hour, tenant_id, status, n in rows}


def mark(engine: Engine) -> datetime | None:
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT until FROM mdm.aa_email_hour_rollup")).scalar_one_or_none()


async def tally_all(rounds: EmailHourTally) -> list[TallyResult]:
    """Rounds until one finds nothing left to tally."""
    done = []
    while (result := await rounds.run_once()).hours:
        done.append(result)
    return done


def spread(engine: Engine, tenant: uuid.UUID, other: uuid.UUID, now: datetime) -> None:
    """A week of answered and unanswered rows, on both sides of hour boundaries and of the
    windows' starts, in the margin, and now; some bounced at send time, some later, one
    complaint."""
    top = whole_hour(now)
    times = [top - timedelta(hours=h, minutes=m) for h in (1, 5, 23, 30, 100, 160)
             for m in (0, 17, 41)]
    for edge in (whole_hour(now - timedelta(hours=24)), whole_hour(now - timedelta(days=7))):
        times += [edge - timedelta(microseconds=1), edge, edge + timedelta(minutes=3)]
    times += [now - timedelta(days=9), now - MARGIN / 2, now]
    add_log(engine, tenant, *times)
    add_log(engine, other, *times[::3])
    add_log(engine, tenant, *times[1::4], status="bounced")
    add_log(engine, tenant, *times[2::5], status="deferred")  # no answer yet: not counted
    add_log(engine, tenant, *times[::6], status="partial", delivery="bounced")
    add_log(engine, other, times[4], delivery="complained")
    add_log(engine, other, times[5], status="bounced", delivery="bounced")  # one bounce


async def test_the_rates_are_the_logs_from_the_tally_or_live_and_late_bounces_count(
        engine: Engine, async_engine: AsyncEngine, tenant, other_tenant):
    now = db_now(engine)
    spread(engine, tenant, other_tenant, now)
    expected = truth(engine, now)
    assert expected[tenant][3] > expected[tenant][0] > 0 and expected[other_tenant][5] == 1
    # No tally yet: the whole week counted live.
    assert rates(engine, now) == expected

    await tally_all(EmailHourTally(async_engine))
    until = mark(engine)
    assert until is not None
    # Every hour that ended more than the margin ago, and none after.
    assert until in {whole_hour(t - MARGIN) for t in (now, db_now(engine))}
    tallied = tally(engine)
    assert tallied and all(hour < until for hour, _, _ in tallied)
    assert sum(n for (_, t, s), n in tallied.items() if t == other_tenant and s == "sent") \
        == sum(1 for at in truth_rows(engine, other_tenant) if at < until)
    assert rates(engine, now) == expected
    assert rates(engine, now, tenant) == {tenant: expected[tenant]}

    # A bounce reported after its hour was tallied: read from the log, so it counts.
    with engine.begin() as conn:
        conn.execute(text(
            "UPDATE mdm.aa_email_log SET delivery = 'bounced' WHERE id = (SELECT id FROM "
            "mdm.aa_email_log WHERE tenant_id = :t AND status = 'sent' AND delivery IS NULL"
            " AND created_at < :until AND created_at >= :week LIMIT 1)"),
            {"t": other_tenant, "until": until, "week": whole_hour(now - timedelta(days=7))})
    later = truth(engine, now)
    assert later[other_tenant][4] == expected[other_tenant][4] + 1
    assert rates(engine, now) == later


def truth_rows(engine: Engine, tenant_id: uuid.UUID) -> list[datetime]:
    with engine.connect() as conn:
        return list(conn.execute(text(
            "SELECT created_at FROM mdm.aa_email_log WHERE tenant_id = :t AND status = 'sent'"
            " AND created_at >= :since"),
            {"t": tenant_id, "since": whole_hour(db_now(engine)) - CATCH_UP}).scalars())


async def test_leaders_racing_and_rounds_again_count_each_hour_once(
        engine: Engine, async_engine: AsyncEngine, tenant, other_tenant):
    now = db_now(engine)
    spread(engine, tenant, other_tenant, now)
    expected = truth(engine, now)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO mdm.aa_email_hour_rollup (id) VALUES (true)"))

    # Two leaders (a lease that changed hands mid-round) start a round while the mark's
    # row is locked: both wait, then run one after the other.
    a, b = EmailHourTally(async_engine), EmailHourTally(async_engine)
    with engine.connect() as blocker:
        blocker.execute(text("SELECT * FROM mdm.aa_email_hour_rollup FOR UPDATE"))
        both = asyncio.gather(a.run_once(), b.run_once())
        try:
            await wait_until(lambda: asyncio.to_thread(
                waiting_on_a_lock, engine, 2, "aa_email_hour_rollup"))
        finally:  # let them finish whatever happened, so no transaction is left open
            blocker.commit()
            first, second = await both
    # The second found the hours the first tallied and took the next ones.
    assert first.hours == second.hours == MAX_HOURS_PER_ROUND
    assert first.until != second.until
    await tally_all(a)
    await asyncio.gather(a.run_once(), b.run_once())  # nothing left: they tally nothing
    assert (await b.run_once()).hours == 0
    counted = tally(engine)
    assert rates(engine, now) == expected

    # The mark lost (cleared by hand): the hours are tallied again and replace their
    # counts, they do not add to them.
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_email_hour_rollup SET until = NULL"))
    await tally_all(a)
    assert tally(engine) == counted
    assert rates(engine, now) == expected



async def test_catch_up_covers_the_week_a_few_hours_a_round_and_old_hours_go(
        engine: Engine, async_engine: AsyncEngine, tenant):
    now = db_now(engine)
    gone = uuid.uuid4()  # a tenant deleted since: its log rows stay, out of the tally
    add_log(engine, tenant, now - timedelta(days=3), now - timedelta(days=10))
    add_log(engine, gone, now - timedelta(days=2))
    with engine.begin() as conn:  # a tally row from before the week kept
        conn.execute(text("INSERT INTO mdm.aa_email_hour VALUES (:h, :t, 'sent', 7)"),
                     {"h": whole_hour(now) - KEEP - 2 * HOUR, "t": tenant})
    rounds = EmailHourTally(async_engine)
    first = await rounds.run_once()
    assert first.hours == MAX_HOURS_PER_ROUND and first.until is not None
    # From the week's start on, not from the beginning of the log; the old row is gone.
    cutoff = first.until - MAX_HOURS_PER_ROUND * HOUR + CATCH_UP
    assert cutoff in {whole_hour(t - MARGIN) for t in (now, db_now(engine))}
    rest = await tally_all(rounds)
    assert all(r.hours <= MAX_HOURS_PER_ROUND for r in rest)
    assert len(rest) + 1 == -(-CATCH_UP // (MAX_HOURS_PER_ROUND * HOUR))
    assert tally(engine) == {(whole_hour(now - timedelta(days=3)), tenant, "sent"): 1}


async def test_the_maintenance_leader_tallies_and_the_worker_is_built_with_it(
        engine: Engine, async_engine: AsyncEngine, database_url, tenant):
    # In the first hours of the week, which a first round tallies.
    add_log(engine, tenant, db_now(engine) - timedelta(days=7) + 2 * HOUR)

    def keeper(holder: str) -> Maintenance:
        return Maintenance(async_engine, holder=holder, interval_secs=10,
                           rescuer=Rescuer(async_engine, lease_secs=450, actor=holder),
                           rollups=(DoneRollup(async_engine), EmailHourTally(async_engine)))

    leader, follower = keeper("a"), keeper("b")
    try:
        assert await leader.run_once() is True
        assert mark(engine) is not None and tally(engine)
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE mdm.aa_email_hour_rollup, mdm.aa_email_hour"))
        assert await follower.run_once() is False
        assert mark(engine) is None and tally(engine) == {}
    finally:
        await leader.stop()
        await follower.stop()
    process = build_worker(Settings(database_url=database_url),
                           Database(url=sqlalchemy_url(database_url)))
    assert process.maintenance is not None
    assert [type(r) for r in process.maintenance.rollups] == [DoneRollup, EmailHourTally]
    for close in process.closers:
        await close()
