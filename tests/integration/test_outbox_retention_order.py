"""Outbox retention and ordered routes: the relay holds an aggregate's next ordered job
back while an earlier event's ordered job is unfinished, and reads that from the earlier
event and its delivery link. Retention must keep them until that job has finished."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text

from postrelay.core.clock import utcnow
from postrelay.relay import JobRequest, Relay, RouteRegistry, delete_handled_batch, emit


def ledger_routes() -> RouteRegistry:
    routes = RouteRegistry()
    routes.add("account.*", lambda e: JobRequest("bulk_import", {"seq": e.payload["seq"]},
                                                 ordered=True), name="ledger")
    return routes


def emit_change(engine, tenant, seq: int) -> None:
    with engine.begin() as conn:
        emit(conn, "account.changed", {"seq": seq}, tenant_id=tenant,
             aggregate_type="account", aggregate_id="a")


def jobs(engine) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        return [(int(seq), status) for seq, status in conn.execute(text(
            "SELECT payload->>'seq', status::text FROM mdm.aa_job ORDER BY created_at"))]


async def test_an_event_whose_ordered_job_is_unfinished_is_kept(engine, async_engine, tenant):
    """An event handled longer ago than the window, whose ordered job still waited (a
    retry's backoff, a paused kind, a short POSTRELAY_OUTBOX_RETENTION_DAYS), was deleted
    with its link; the relay then saw nothing unfinished before the aggregate's next event
    and made its job at once, to run beside or before the first."""
    emit_change(engine, tenant, 1)
    relay = Relay(async_engine, ledger_routes())
    await relay.run_once()
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_outbox_event SET handled_at = now() - interval '8 days'"))
    before = utcnow() - timedelta(days=7)
    assert await delete_handled_batch(async_engine, before, 1000) == 0
    emit_change(engine, tenant, 2)
    await relay.run_once()
    assert jobs(engine) == [(1, "pending")]  # the second waits for the first

    with engine.begin() as conn:  # the first finished (dead-lettered: it does not stall)
        conn.execute(text("UPDATE mdm.aa_job SET status = 'dlq', completed_at = now()"))
    assert await delete_handled_batch(async_engine, before, 1000) == 1
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_outbox_event SET available_at = now()"))
    await relay.run_once()
    assert jobs(engine) == [(1, "dlq"), (2, "pending")]


async def test_a_pending_job_of_an_unordered_route_keeps_nothing(engine, async_engine,
                                                                 tenant):
    """Only an ordered link keeps its event: an unordered job reads nothing of its event."""
    routes = RouteRegistry()
    routes.add("account.*", lambda e: JobRequest("bulk_import", {"seq": e.payload["seq"]}),
               name="loose")
    emit_change(engine, tenant, 1)
    await Relay(async_engine, routes).run_once()
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_outbox_event SET handled_at = now() - interval '8 days'"))
    assert await delete_handled_batch(async_engine, utcnow() - timedelta(days=7), 1000) == 1
    assert jobs(engine) == [(1, "pending")]
