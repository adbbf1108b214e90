"""The caps per event on jobs (POSTRELAY_RELAY_MAX_JOBS_PER_EVENT) and on their payload
bytes (POSTRELAY_RELAY_MAX_BYTES_PER_EVENT): routes that ask for more fail their own event,
with no job of it made, and the batch goes on; the relay process reads the caps from its
settings."""

from __future__ import annotations

import itertools
import subprocess
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from postrelay.core.settings import load_settings
from postrelay.queue import FixedBackoff
from postrelay.relay import Event, JobRequest, Relay, RelayConfig, RouteRegistry, emit
from tests.integration.test_relay_process import POSTRELAY, ROOT, wait_for

CAP_RULE = "the limit per event (POSTRELAY_RELAY_MAX_JOBS_PER_EVENT)"


@pytest.fixture
def outbox_clean(clean_db):
    """clean_db empties the outbox tables too."""


def fanout_routes() -> RouteRegistry:
    """list.blast: `n` jobs from one route, and one more from a second; list.endless: a
    route that never stops yielding."""
    routes = RouteRegistry()

    @routes.route("list.blast", name="blast")
    def blast(event: Event) -> list[JobRequest]:
        return [JobRequest("reindex", {"n": n}, key=str(n)) for n in range(event.payload["n"])]

    @routes.route("list.blast", name="summary")
    def summary(event: Event) -> JobRequest:
        return JobRequest("bulk_import", {"of": event.payload["n"]})

    @routes.route("list.endless", name="endless")
    def endless(event: Event) -> Iterator[JobRequest]:
        return (JobRequest("reindex", {"n": n}, key=str(n)) for n in itertools.count())

    return routes


def emit_blasts(engine, tenant, *sizes: int, event_type: str = "list.blast") -> list[uuid.UUID]:
    with engine.begin() as conn:
        return [emit(conn, event_type, {"n": n}, tenant_id=tenant,  # type: ignore[misc]
                     aggregate_type="list", aggregate_id=n) for n in sizes]


def outcome(engine) -> dict[uuid.UUID, tuple[bool, int, int, str | None]]:
    """Each event: handled, its jobs, its delivery links, its last error."""
    with engine.connect() as conn:
        return {row[0]: tuple(row[1:]) for row in conn.execute(text(
            "SELECT e.id, e.handled_at IS NOT NULL, "
            "  (SELECT count(*) FROM mdm.aa_job j "
            "   WHERE j.idempotency_key LIKE 'outbox:' || e.id || ':%'), "
            "  (SELECT count(*) FROM mdm.aa_outbox_delivery d WHERE d.event_id = e.id), "
            "  e.last_error FROM mdm.aa_outbox_event e"))}


async def test_an_event_past_the_cap_fails_alone_with_no_job(engine, async_engine, tenant,
                                                              outbox_clean):
    """A route that asked for a huge number of jobs for one event (a bug, or a fan-out
    over a whole user table) had them all written in one relay transaction."""
    under, at, past_by_second, past_by_first = emit_blasts(engine, tenant, 3, 4, 5, 9)
    relay = Relay(async_engine, fanout_routes(),
                  RelayConfig(max_jobs_per_event=5, max_attempts=1), backoff=FixedBackoff(0))
    result = await relay.run_once()
    assert (result.handled, result.jobs, result.failed, result.dead) == (2, 9, 2, 2)
    found = outcome(engine)
    assert found[under][:3] == (True, 4, 4) and found[at][:3] == (True, 5, 5)
    for failed in (past_by_second, past_by_first):
        handled, jobs, links, error = found[failed]
        assert (handled, jobs, links) == (False, 0, 0)  # nothing half-written
        assert CAP_RULE in error and "past 5 jobs" in error
    # The route that takes the event past the cap is the one named.
    assert "route 'summary'" in found[past_by_second][3]
    assert "route 'blast'" in found[past_by_first][3]
    assert found[past_by_first][3].startswith("ValidationError: jobs: ")


async def test_a_route_that_never_stops_is_read_no_further_than_the_cap(
        engine, async_engine, tenant, outbox_clean):
    [endless] = emit_blasts(engine, tenant, 0, event_type="list.endless")
    [fine] = emit_blasts(engine, tenant, 2)
    # The default cap, 10,000: the endless route is cut off one past it.
    relay = Relay(async_engine, fanout_routes(), RelayConfig(max_attempts=1))
    result = await relay.run_once()
    assert (result.handled, result.jobs, result.failed) == (1, 3, 1)
    handled, jobs, links, error = outcome(engine)[endless]
    assert (handled, jobs, links) == (False, 0, 0)
    assert "route 'endless' takes the event past 10,000 jobs" in error
    assert outcome(engine)[fine][:3] == (True, 3, 3)


def test_the_default_cap_is_the_settings_and_the_relays(monkeypatch):
    monkeypatch.delenv("POSTRELAY_RELAY_MAX_JOBS_PER_EVENT", raising=False)
    assert load_settings().relay_max_jobs_per_event == RelayConfig().max_jobs_per_event == 10_000


def test_the_relay_process_takes_the_cap_from_its_setting(engine, tenant, worker_env,
                                                          outbox_clean):
    within, past = emit_blasts(engine, tenant, 3, 4)
    env = {**worker_env, "POSTRELAY_RELAY_MAX_JOBS_PER_EVENT": "3",
           "POSTRELAY_RELAY_MAX_ATTEMPTS": "1"}
    relay = subprocess.Popen([POSTRELAY, "relay", "--app", "tests.apps.fanout"], env=env,
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        wait_for(lambda: outcome(engine)[past][3] is not None and outcome(engine)[within][0])
    finally:
        relay.terminate()
        output = relay.communicate(timeout=30)[0]
    assert outcome(engine)[within][:3] == (True, 3, 3)
    handled, jobs, links, error = outcome(engine)[past]
    assert (handled, jobs, links) == (False, 0, 0)
    assert "route 'blast' takes the event past 3 jobs" in error and CAP_RULE in error
    assert "postrelay.relay.routing_failed" in output


def copying_routes() -> RouteRegistry:
    """list.copied: `n` jobs that each carry the event's whole payload, as a split email
    route does."""
    routes = RouteRegistry()

    @routes.route("list.copied", name="copies")
    def copies(event: Event) -> list[JobRequest]:
        return [JobRequest("reindex", dict(event.payload), key=str(n))
                for n in range(event.payload["n"])]

    return routes


async def test_an_event_past_the_payload_bytes_per_event_fails_alone(
        engine, async_engine, tenant, outbox_clean):
    """Ten thousand copies of a large payload were written in one relay transaction, every
    copy held in the relay's memory first: gigabytes for one newsletter event."""
    with engine.begin() as conn:
        under, past = (emit(conn, "list.copied", {"n": n, "text": "x" * 2_000},
                            tenant_id=tenant, aggregate_type="list", aggregate_id=n)
                       for n in (4, 6))
    relay = Relay(async_engine, copying_routes(),
                  RelayConfig(max_bytes_per_event=10_000, max_attempts=1),
                  backoff=FixedBackoff(0))
    result = await relay.run_once()
    assert (result.handled, result.jobs, result.failed) == (1, 4, 1)
    found = outcome(engine)
    assert found[under][:3] == (True, 4, 4)
    handled, jobs, links, error = found[past]
    assert (handled, jobs, links) == (False, 0, 0)  # nothing half-written
    assert "route 'copies' takes the event past 10,000 bytes of job payload" in error
    assert "(POSTRELAY_RELAY_MAX_BYTES_PER_EVENT)" in error


def test_the_default_payload_bytes_per_event_is_the_settings_and_the_relays(monkeypatch):
    monkeypatch.delenv("POSTRELAY_RELAY_MAX_BYTES_PER_EVENT", raising=False)
    assert load_settings().relay_max_bytes_per_event == \
        RelayConfig().max_bytes_per_event == 64 << 20
