"""An event as large or as deep as an event may be still becomes its email: the
`email_send` job wraps the payload (the `context`, the addresses, the event's ids), and
that wrapper must not push the job over the limit the event itself passed."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from postrelay.core.jsontext import encode_document
from postrelay.core.limits import MAX_DEPTH, MAX_PAYLOAD_BYTES_ENV
from postrelay.orchestrator import email_route
from postrelay.relay import JobRequest, Relay, RouteRegistry, emit

SENDER = "Acme <noreply@acme.example>"
LIMIT = 4096


def _filled(limit: int, base: dict[str, Any]) -> dict[str, Any]:
    """`base` with a `pad` string that brings it to exactly `limit` bytes as JSON."""
    payload = {**base, "pad": ""}
    payload["pad"] = "x" * (limit - len(encode_document(payload, "payload", limit)))
    assert len(encode_document(payload, "payload", limit)) == limit
    return payload


def _deep(levels: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(levels):
        value = {"n": value}
    return value


def _event_rows(engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(text(
            "SELECT handled_at, dead_at, last_error FROM mdm.aa_outbox_event")).mappings()]


def _jobs(engine) -> dict[str, dict[str, Any]]:
    with engine.connect() as conn:
        return {r.job_kind: r.payload for r in conn.execute(text(
            "SELECT job_kind::text AS job_kind, payload FROM mdm.aa_job"))}


async def test_an_event_at_the_size_limit_becomes_its_email_and_its_other_jobs(
        engine, async_engine, tenant, clean_db, monkeypatch, rig, templates_dir):
    monkeypatch.setenv(MAX_PAYLOAD_BYTES_ENV, str(LIMIT))
    routes = RouteRegistry()
    email_route("user.signed_up", template="welcome", to="user.email", routes=routes,
                bcc="audit@acme.example", category="onboarding", sender=SENDER)
    routes.add("user.signed_up", lambda e: JobRequest("cleanup_jobs", {}), name="other")
    payload = _filled(LIMIT, {"user": {"name": "Ann", "email": "ann@example.com"}})
    with engine.begin() as conn:
        emit(conn, "user.signed_up", payload, tenant_id=tenant, aggregate_type="user",
             aggregate_id="ann")

    result = await Relay(async_engine, routes).run_once()

    assert (result.handled, result.failed, result.jobs) == (1, 0, 2), _event_rows(engine)
    jobs = _jobs(engine)
    assert jobs["email_send"]["context"]["pad"] == payload["pad"]
    assert "cleanup_jobs" in jobs
    with engine.connect() as conn:
        job_id = conn.execute(text(
            "SELECT id FROM mdm.aa_job WHERE job_kind = 'email_send'")).scalar_one()
    await rig.start(kinds=["email_send"])
    await rig.settle(job_id)
    assert rig.job(job_id)["status"] == "done"
    assert [m.message["Subject"] for m in rig.sink.handler.received] == ["Welcome, Ann!"]


async def test_an_event_nested_as_deep_as_allowed_becomes_its_email(
        engine, async_engine, tenant, clean_db, rig):
    routes = RouteRegistry()
    email_route("user.signed_up", template="welcome", to="user.email", routes=routes,
                sender=SENDER)
    # The payload itself is one level; `deep` takes the other MAX_DEPTH - 1.
    payload = {"user": {"name": "Ann", "email": "ann@example.com"},
               "deep": _deep(MAX_DEPTH - 2, [])}
    with engine.begin() as conn:
        emit(conn, "user.signed_up", payload, tenant_id=tenant, aggregate_type="user",
             aggregate_id="ann")

    result = await Relay(async_engine, routes).run_once()

    assert (result.handled, result.failed) == (1, 0), _event_rows(engine)
    with engine.connect() as conn:
        job_id = conn.execute(text(
            "SELECT id FROM mdm.aa_job WHERE job_kind = 'email_send'")).scalar_one()
    await rig.start(kinds=["email_send"])
    await rig.settle(job_id)
    assert rig.job(job_id)["status"] == "done"


async def test_a_route_job_far_over_the_limit_still_fails_its_event_by_name(
        engine, async_engine, tenant, clean_db, monkeypatch):
    """The room is for what a route wraps around the event, not a second limit."""
    monkeypatch.setenv(MAX_PAYLOAD_BYTES_ENV, str(LIMIT))
    routes = RouteRegistry()
    routes.add("user.signed_up", lambda e: JobRequest("cleanup_jobs", {
        "copies": [e.payload] * 40}), name="bloated")
    with engine.begin() as conn:
        emit(conn, "user.signed_up", _filled(LIMIT, {}), tenant_id=tenant,
             aggregate_type="user", aggregate_id="ann")

    result = await Relay(async_engine, routes).run_once()

    assert result.failed == 1
    (row,) = _event_rows(engine)
    assert "over the limit" in row["last_error"] and "bloated" in row["last_error"]
