"""An event whose payload names no usable recipient for an email route: that route's
message fails by itself, with the reason in the email log, and the event's other routes
(webhooks, other jobs) are not held hostage by it."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from postrelay.orchestrator import email_route
from postrelay.relay import JobRequest, Relay, RouteRegistry, emit

SENDER = "Acme <noreply@acme.example>"


def _kinds(engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return {r.job_kind: r.id for r in conn.execute(text(
            "SELECT job_kind::text AS job_kind, id FROM mdm.aa_job"))}


@pytest.mark.parametrize(("payload", "route", "field", "words"), [
    ({"user": {"name": "Ann"}}, {}, "to", "has no 'user.email'"),
    ({"user": {"name": "Ann", "email": []}}, {}, "to", "names no recipient"),
    ({"user": {"name": "Ann", "email": None}}, {}, "to", "names no recipient"),
    ({"user": {"name": "Ann", "email": 42}}, {}, "to", "got int"),
    ({"user": {"name": "Ann", "email": "ann@example.com"}, "boss": 7},
     {"cc": "boss"}, "cc", "got int"),
    # The object, not its `email`: its keys were taken for addresses.
    ({"user": {"name": "Ann", "email": "ann@example.com"}}, {"to": "user"}, "to",
     "got dict"),
    # As the README's own example reads an invoice's billing contacts.
    ({"user": {"name": "Ann"}}, {"to": lambda e: e.payload["billing"]["emails"]}, "to",
     "raised KeyError: 'billing'"),
])
async def test_an_event_naming_no_recipient_fails_only_its_message_with_a_log_row(
        engine, async_engine, tenant, clean_db, rig, payload, route, field, words):
    routes = RouteRegistry()
    route = {"to": "user.email", **route}
    email_route("user.signed_up", template="welcome", sender=SENDER, routes=routes, **route)
    routes.add("user.signed_up", lambda e: JobRequest("cleanup_jobs", {}), name="other")
    with engine.begin() as conn:
        event_id = emit(conn, "user.signed_up", payload, tenant_id=tenant,
                        aggregate_type="user", aggregate_id="ann")

    result = await Relay(async_engine, routes).run_once()

    assert (result.handled, result.failed) == (1, 0)
    kinds = _kinds(engine)
    assert "cleanup_jobs" in kinds  # the event's other route went
    job_id = kinds["email_send"]
    await rig.start(kinds=["email_send"])
    await rig.settle(job_id)
    job = rig.job(job_id)
    assert job["status"] == "dlq" and job["attempts"] == 1
    [row] = rig.log(job_id)
    assert row["status"] == "failed" and row["error"].startswith(f"{field}: ")
    assert words in row["error"] and str(row["event_id"]) == str(event_id)
    assert rig.sink.handler.received == []
