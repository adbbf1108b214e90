"""The outbox over HTTP: the relay's status, one event and its jobs, replay, and the relay's
lag in /metrics. Events are relayed by a real Relay (run_once) on the test database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from postrelay.queue import FixedBackoff
from postrelay.relay import Event, JobRequest, Relay, RelayConfig, RouteRegistry, emit
from tests.api.conftest import data, error, tenant_key

STATUS = "/v1/functions/outbox/status"
REPLAY = "/v1/functions/outbox/replay"
EVENT_FIELDS = {"id", "tenant_id", "event_type", "aggregate_type", "aggregate_id", "payload",
                "headers", "status", "attempts", "error", "created_at", "created_by",
                "available_at", "handled_at", "dead_at", "jobs"}


def shop_routes() -> RouteRegistry:
    """order.placed: a reindex job and an import job; order.broken: routing always fails."""
    routes = RouteRegistry()
    routes.add("order.placed", lambda e: JobRequest("reindex", {"order": e.aggregate_id}),
               name="reindex-order")
    routes.add("order.placed", lambda e: JobRequest("bulk_import", {"order": e.aggregate_id}),
               name="import-order")

    @routes.route("order.broken", name="broken")
    def broken(event: Event) -> JobRequest:
        raise RuntimeError(f"cannot route order {event.aggregate_id}")

    return routes


def relay(async_engine) -> Relay:
    # One attempt: a broken event is dead after its first batch.
    return Relay(async_engine, shop_routes(), RelayConfig(max_attempts=1),
                 backoff=FixedBackoff(0))


def emit_order(engine, tenant, order: int | str, event_type: str = "order.placed") -> uuid.UUID:
    with engine.begin() as conn:
        return emit(conn, event_type, {"order": order}, tenant_id=tenant,  # type: ignore[return-value]
                    aggregate_type="order", aggregate_id=order, created_by="shop")


def count_jobs(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM mdm.aa_job")).scalar_one()


def backdate(engine, event_id: uuid.UUID, secs: float) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_outbox_event SET created_at = now() - "
                          "make_interval(secs => :s) WHERE id = :id"), {"s": secs, "id": event_id})


async def test_status_counts_backlog_lag_handled_and_dead(api, engine, async_engine, tenant,
                                                         other_tenant):
    empty = data(api.get(STATUS))
    assert empty == {"backlog": 0, "lag_secs": None, "dead": 0, "handled": 0, "retrying": 0,
                     "dead_events": []}
    emit_order(engine, tenant, 1)
    emit_order(engine, tenant, 2)
    broken = emit_order(engine, tenant, 3, "order.broken")
    await relay(async_engine).run_once()
    waiting = emit_order(engine, tenant, 4)
    backdate(engine, waiting, 90)
    emit_order(engine, other_tenant, 5)

    status = data(api.get(STATUS))
    counts = (status["backlog"], status["handled"], status["dead"], status["retrying"])
    assert counts == (2, 2, 1, 0)
    assert 90 <= status["lag_secs"] < 150
    [dead] = status["dead_events"]
    assert dead["id"] == str(broken) and dead["tenant_id"] == str(tenant)
    assert (dead["event_type"], dead["aggregate_type"], dead["aggregate_id"]) == (
        "order.broken", "order", "3")
    assert dead["attempts"] == 1 and "cannot route order 3" in dead["last_error"]
    assert dead["dead_at"] is not None

    # A tenant key sees its tenant's events only.
    globex = tenant_key(engine, "globex-app", other_tenant)
    own = data(api.get(STATUS, headers={"apikey": globex}))
    assert (own["backlog"], own["handled"], own["dead"], own["dead_events"]) == (1, 0, 0, [])


def test_status_needs_a_key(anonymous):
    assert error(anonymous.get(STATUS), 401)["code"] == "unauthorized"
    assert error(anonymous.get(STATUS, headers={"apikey": "wrong"}), 401)


async def test_event_with_every_job_it_produced(api, engine, async_engine, tenant):
    event_id = emit_order(engine, tenant, 7)
    pending = data(api.get(f"/v1/functions/outbox/events/{event_id}"))
    assert set(pending) == EVENT_FIELDS
    assert (pending["status"], pending["jobs"], pending["handled_at"]) == ("pending", [], None)
    assert pending["payload"] == {"order": 7} and pending["aggregate_id"] == "7"
    assert pending["created_by"] == "shop" and pending["headers"] == {}

    await relay(async_engine).run_once()
    event = data(api.get(f"/v1/functions/outbox/events/{event_id}"))
    assert event["status"] == "handled" and event["handled_at"] is not None
    assert event["error"] is None and event["attempts"] == 0
    jobs = {j["route"]: j for j in event["jobs"]}
    assert set(jobs) == {"reindex-order", "import-order"}
    assert (jobs["reindex-order"]["kind"], jobs["reindex-order"]["status"]) == (
        "reindex", "pending")
    assert jobs["import-order"]["kind"] == "bulk_import"
    assert jobs["reindex-order"]["attempts"] == 0
    job = data(api.get(f"/v1/functions/jobs/{jobs['reindex-order']['job_id']}"))
    assert job["payload"] == {"order": "7"}


async def test_dead_event_shows_its_error(api, engine, async_engine, tenant):
    event_id = emit_order(engine, tenant, 8, "order.broken")
    await relay(async_engine).run_once()
    event = data(api.get(f"/v1/functions/outbox/events/{event_id}"))
    assert event["status"] == "dead" and event["jobs"] == [] and event["dead_at"] is not None
    assert "RuntimeError: cannot route order 8" in event["error"]


def test_event_not_found_bad_id_and_other_tenants(api, engine, tenant, other_tenant,
                                                  acme_client, anonymous):
    theirs = emit_order(engine, other_tenant, 9)
    missing = uuid.uuid4()
    assert "no outbox event" in error(api.get(f"/v1/functions/outbox/events/{missing}"),
                                      404)["message"]
    assert error(api.get("/v1/functions/outbox/events/not-a-uuid"), 400)["field"] == "id"
    # acme's key: globex's event is not found, exactly like a missing one.
    assert error(acme_client.get(f"/v1/functions/outbox/events/{theirs}"), 404)
    assert data(api.get(f"/v1/functions/outbox/events/{theirs}"))["id"] == str(theirs)
    assert error(anonymous.get(f"/v1/functions/outbox/events/{theirs}"), 401)


async def test_replay_one_event_creates_no_second_job(api, engine, async_engine, tenant):
    event_id = emit_order(engine, tenant, 10)
    await relay(async_engine).run_once()
    assert count_jobs(engine) == 2
    answer = api.post(REPLAY, json={"eventId": str(event_id)})
    assert answer.json() == {"data": {"replayed": 1}, "meta": None}
    event = data(api.get(f"/v1/functions/outbox/events/{event_id}"))
    assert event["status"] == "pending" and event["handled_at"] is None
    result = await relay(async_engine).run_once()
    assert result.handled == 1
    assert count_jobs(engine) == 2  # the idempotency keys found the jobs of the first relay
    assert data(api.get(f"/v1/functions/outbox/events/{event_id}"))["status"] == "handled"


async def test_replay_a_dead_event_and_a_time_range(api, engine, async_engine, tenant,
                                                    other_tenant, acme_client):
    old = emit_order(engine, tenant, 11)
    dead = emit_order(engine, tenant, 12, "order.broken")
    theirs = emit_order(engine, other_tenant, 13)
    await relay(async_engine).run_once()
    backdate(engine, old, 7200)

    assert data(api.post(REPLAY, json={"eventId": str(dead)})) == {"replayed": 1}
    event = data(api.get(f"/v1/functions/outbox/events/{dead}"))
    assert (event["status"], event["attempts"], event["error"]) == ("pending", 0, None)

    # acme's key replays acme's events only, and cannot name globex's.
    assert data(acme_client.post(REPLAY, json={"since": "2000-01-01T00:00:00Z"})) == {
        "replayed": 2}
    assert error(acme_client.post(REPLAY, json={"eventId": str(theirs)}), 404)
    assert data(api.get(f"/v1/functions/outbox/events/{theirs}"))["status"] == "handled"

    hour_ago = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    # [since, until): only the backdated event was created before an hour ago.
    assert data(api.post(REPLAY, json={"until": hour_ago})) == {"replayed": 1}
    # A time without a zone is UTC; the service-role key replays every tenant's.
    naive = (datetime.now(UTC) - timedelta(hours=1)).replace(tzinfo=None).isoformat()
    assert data(api.post(REPLAY, json={"since": naive})) == {"replayed": 2}
    assert data(api.get(f"/v1/functions/outbox/events/{theirs}"))["status"] == "pending"


@pytest.mark.parametrize(
    ("body", "field"),
    [({}, "eventId"),
     ({"eventId": "not-a-uuid"}, "eventId"),
     ({"eventId": str(uuid.UUID(int=1)), "since": "2026-01-01T00:00:00Z"}, "eventId"),
     ({"since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "until"),
     ({"since": "yesterday"}, "since"),
     # A number was read as seconds since 1970 and replayed the outbox from then.
     ({"since": -1073741825, "until": -634}, "since"),
     ({"until": 1764000000}, "until"),
     ({"event_id": str(uuid.UUID(int=1))}, "event_id")],
)
def test_replay_bad_input_names_the_field(api, tenant, body, field):
    assert error(api.post(REPLAY, json=body), 400)["field"] == field


def test_replay_unknown_event_and_no_key(api, anonymous, tenant):
    assert error(api.post(REPLAY, json={"eventId": str(uuid.uuid4())}), 404)["code"] == (
        "not_found")
    assert error(anonymous.post(REPLAY, json={"since": "2026-01-01T00:00:00Z"}), 401)


def test_openapi_documents_the_outbox(anonymous):
    paths = anonymous.get("/openapi.json").json()["paths"]
    assert set(paths["/v1/functions/outbox/status"]) == {"get"}
    assert set(paths["/v1/functions/outbox/events/{id}"]) == {"get"}
    replay = paths["/v1/functions/outbox/replay"]["post"]
    assert {"400", "401", "404"} <= set(replay["responses"]) and "422" not in replay["responses"]


async def test_metrics_show_the_relay_backlog_lag_and_dead_events(api, engine, async_engine,
                                                                  tenant):
    def samples() -> dict[str, float]:
        response = api.get("/metrics")
        assert response.status_code == 200, response.text
        return {name: float(value) for name, value in (
            line.rsplit(" ", 1) for line in response.text.splitlines()
            if line.startswith("postrelay_outbox_"))}

    assert samples() == {"postrelay_outbox_backlog": 0, "postrelay_outbox_lag_seconds": 0,
                         "postrelay_outbox_dead": 0}
    emit_order(engine, tenant, 20, "order.broken")
    await relay(async_engine).run_once()
    waiting = [emit_order(engine, tenant, n) for n in (21, 22)]
    backdate(engine, waiting[0], 300)
    found = samples()
    assert found["postrelay_outbox_backlog"] == 2 and found["postrelay_outbox_dead"] == 1
    assert 300 <= found["postrelay_outbox_lag_seconds"] < 360
    await relay(async_engine).run_once()
    found = samples()
    assert (found["postrelay_outbox_backlog"], found["postrelay_outbox_lag_seconds"]) == (0, 0)
    assert "# TYPE postrelay_outbox_lag_seconds gauge" in api.get("/metrics").text
